"""Stopping background tasks reliably, and sharing a read among the callers that wait for it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Generic, TypeVar

T = TypeVar("T")

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


class SharedRead(Generic[T]):
    """One read on its way at a time: callers that come while it is on its way wait for that same read, and go on in
    the order they came (a read each would let them go on in the order the replies came: creates that wait for a
    first read would then take their places in the line out of order)."""

    def __init__(self) -> None:
        self._on_way: asyncio.Future[T] | None = None

    async def __call__(self, read: Callable[[], Awaitable[T]]) -> T:
        if self._on_way is None:
            self._on_way = asyncio.ensure_future(read())
            self._on_way.add_done_callback(self._done)
        return await asyncio.shield(self._on_way)

    def _done(self, read: asyncio.Future[T]) -> None:
        if self._on_way is read:
            self._on_way = None  # the next caller reads afresh (after a failure too)
        if not read.cancelled():
            read.exception()  # retrieved: every caller may have been cancelled meanwhile
