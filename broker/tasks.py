"""Stopping background tasks reliably."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

CANCEL_CHECK_S = 0.5


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel tasks and wait for them, cancelling again any that swallowed it.

    Python 3.11's `asyncio.wait_for` (used inside redis-py's pool) drops a cancellation that races with its
    result, so a single cancel() may leave a loop running; a stop must not hang on it.
    """
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=CANCEL_CHECK_S)
