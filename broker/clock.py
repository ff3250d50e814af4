"""Time as an input: the Clock port and its system implementation."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    """Wall-clock epoch milliseconds."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000
