"""The line's figures as this replica last read them (SPEC S3.8, S4.2): /readyz and the console read them afresh,
/metrics takes a read under MAX_AGE_S old (a scrape beside a /readyz costs no second read), and reads that
overlap share one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from broker.admission.state import LineState

#: How old a read /metrics takes: gauges a Prometheus scrape reads every 10 s or more.
MAX_AGE_S = 1.0

Read = Callable[[], Awaitable[LineState]]


class LineSnapshot:
    """One replica's last read of the line's figures, and the read under way."""

    def __init__(self, max_age_s: float = MAX_AGE_S) -> None:
        self._max_age_s = max_age_s
        self._last: tuple[float, LineState] | None = None
        self._reading: asyncio.Future[LineState] | None = None

    async def fresh(self, read: Read) -> LineState:
        """A read begun now (what a /readyz answers reflects every write before it)."""
        started = time.monotonic()
        state = await read()
        if self._last is None or self._last[0] <= started:
            self._last = (started, state)
        return state

    async def recent(self, read: Read) -> LineState:
        """The last read when under MAX_AGE_S old, else the read under way, else a new one."""
        if self._last is not None and time.monotonic() - self._last[0] < self._max_age_s:
            return self._last[1]
        if self._reading is None:
            self._reading = asyncio.ensure_future(self.fresh(read))
            self._reading.add_done_callback(self._done)
        return await asyncio.shield(self._reading)

    def _done(self, reading: asyncio.Future[LineState]) -> None:
        if self._reading is reading:
            self._reading = None
        if not reading.cancelled():
            reading.exception()  # retrieved: a failed read is raised to its callers, never logged as lost
