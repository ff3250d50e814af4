"""Reads one Hermes event stream into a buffer, so the runner can wait on it, a stop and a timer at once.

A Hermes stream is single-use: it is opened at most once per attempt, by the replica that got
the attempt accepted, and it keeps running across the runner's other work (a stop, a poll).

A burst of streamed events is stored in one write (issue 21): a job's events are taken at most once per
LINGER_S, so an answer streamed a word every few ms costs a write per LINGER_S instead of a write per word, while
an event that comes after a quiet LINGER_S goes at once (a slow stream waits for nothing). Only the answer's text
and the activity around it wait; an event that changes the job (a terminal event, an approval request, an event
a newer Hermes adds) is written as soon as it is read, with whatever waited before it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

from broker.hermes.client import HermesClient
from broker.hermes.models import Comment, HermesEvent, StreamEnded, StreamItem
from broker.logging import get_logger

#: A stream that delivers no event for this long is treated as hung (Hermes 0.19.0 can hang on keepalives).
IDLE_TIMEOUT_S = 3600.0
#: The least time between two takes of events that may wait: a live reader sees streamed text at most this much
#: later than Hermes sent it (20 frames a second, below what a reader notices), and Redis gets a write per 50 ms
#: of streaming instead of one per delta.
LINGER_S = 0.05
#: Events that may wait for the next ones (they change no status: text and activity).
LINGERING = frozenset({"message.delta", "reasoning.available", "tool.started", "tool.completed"})
#: A write stops waiting for more once it has this many events.
MOST_PER_WRITE = 256


class Nudge:
    """A runner's flag that something outside it changed the job (a stop, an approval): its waits end on it.

    An asyncio.Event whose waits cost no task: a wait is one future, ended by the flag, a timer or (in
    Pump.wait) the stream's next item (a follow waits once per batch of Hermes events)."""

    __slots__ = ("_set", "_waiters")

    def __init__(self) -> None:
        self._set = False
        self._waiters: set[asyncio.Future[None]] = set()

    def set(self) -> None:
        self._set = True
        for waiter in self._waiters:
            release(waiter)

    def is_set(self) -> bool:
        return self._set

    def clear(self) -> None:
        self._set = False

    async def sleep(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s`, less when set; True when set."""
        if not self._set:
            await self.wait(asyncio.get_running_loop().create_future(), timeout_s)
        return self._set

    async def wait(self, waiter: asyncio.Future[None], timeout_s: float) -> None:
        """Wait for `waiter` (ended by whoever holds it), the flag, or `timeout_s`."""
        timer = asyncio.get_running_loop().call_later(timeout_s, release, waiter)
        self._waiters.add(waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiters.discard(waiter)


def release(waiter: asyncio.Future[None]) -> None:
    """End a wait of Nudge.wait (once)."""
    if not waiter.done():
        waiter.set_result(None)


class Pump:
    def __init__(
        self, hermes: HermesClient, attempt: int, hermes_run_id: str, *, linger_s: float | None = None
    ) -> None:
        self.attempt = attempt
        self.hermes_run_id = hermes_run_id
        self.ended = False
        self._linger_s = LINGER_S if linger_s is None else linger_s
        self._urgent = False  #: an item read since the last drain may not wait (see LINGERING)
        self._taken_at = asyncio.get_running_loop().time()  #: when the runner last took items (loop time)
        self._items: deque[StreamItem] = deque()
        self._waiter: asyncio.Future[None] | None = None  #: the runner's wait for the next item
        self._task = asyncio.create_task(self._run(hermes), name=f"pump-{hermes_run_id}")

    def _put(self, item: StreamItem) -> None:
        self._items.append(item)
        if not (isinstance(item, HermesEvent) and item.name in LINGERING):
            self._urgent = True
        if self._waiter is not None:
            release(self._waiter)

    async def _run(self, hermes: HermesClient) -> None:
        stream = hermes.events(self.hermes_run_id, idle_timeout_s=IDLE_TIMEOUT_S)
        try:
            async for item in stream:
                if not isinstance(item, Comment):
                    self._put(item)
        except Exception as error:  # a loop guard: a broken stream must still end the follow
            self._put(StreamEnded(clean=False))
            get_logger(type(self)).warning(
                "Lost a Hermes event stream.", extra={"hermesRun": self.hermes_run_id, "error": repr(error)}
            )
        finally:
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                await closer()

    async def wait(self, timeout_s: float, wake: Nudge) -> list[StreamItem]:
        """Items that are there, waiting up to `timeout_s` for the first (or until `wake` is set); when every item
        may wait, for more until LINGER_S after the last take (or one that may not, `MOST_PER_WRITE` of them,
        `wake`)."""
        if not self._items and not wake.is_set():
            await self._next(timeout_s, wake)
        if self._lingering():
            deadline = self._taken_at + self._linger_s
            while self._lingering() and not wake.is_set():
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                await self._next(left, wake)
        return self._drain()

    def take(self) -> list[HermesEvent]:
        """The events read and not yet taken, without waiting (a runner stopping mid-linger stores them)."""
        return self.events(self._drain())

    async def _next(self, timeout_s: float, wake: Nudge) -> None:
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await wake.wait(self._waiter, timeout_s)
        finally:
            self._waiter = None

    def _lingering(self) -> bool:
        """Whether what was read may wait for more: some events, all of them text or activity, not too many."""
        return 0 < len(self._items) < MOST_PER_WRITE and not self._urgent and self._linger_s > 0

    def events(self, items: list[StreamItem]) -> list[HermesEvent]:
        return [item for item in items if isinstance(item, HermesEvent)]

    def _drain(self) -> list[StreamItem]:
        items = list(self._items)
        self._items.clear()
        self._urgent = False
        if items:
            self._taken_at = asyncio.get_running_loop().time()
        if any(not isinstance(item, HermesEvent) for item in items):
            self.ended = True  # StreamEnded, or the stream could not be opened
        return items

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
