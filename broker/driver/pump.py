"""Reads one Hermes event stream into a queue, so the runner can wait on it, a stop and a timer at once.

A Hermes stream is single-use: it is opened at most once per attempt, by the replica that got
the attempt accepted, and it keeps running across the runner's other work (a stop, a poll).
"""

from __future__ import annotations

import asyncio
import contextlib

from broker.hermes.client import HermesClient
from broker.hermes.models import Comment, HermesEvent, StreamEnded, StreamItem
from broker.logging import get_logger

#: A stream that delivers no event for this long is treated as hung (Hermes 0.19.0 can hang on keepalives).
IDLE_TIMEOUT_S = 3600.0


class Pump:
    def __init__(self, hermes: HermesClient, attempt: int, hermes_run_id: str) -> None:
        self.attempt = attempt
        self.hermes_run_id = hermes_run_id
        self.ended = False
        self._queue: asyncio.Queue[StreamItem] = asyncio.Queue()
        self._task = asyncio.create_task(self._run(hermes), name=f"pump-{hermes_run_id}")

    async def _run(self, hermes: HermesClient) -> None:
        stream = hermes.events(self.hermes_run_id, idle_timeout_s=IDLE_TIMEOUT_S)
        try:
            async for item in stream:
                if not isinstance(item, Comment):
                    self._queue.put_nowait(item)
        except Exception as error:  # a loop guard: a broken stream must still end the follow
            self._queue.put_nowait(StreamEnded(clean=False))
            get_logger(type(self)).warning(
                "Lost a Hermes event stream.", extra={"hermesRun": self.hermes_run_id, "error": repr(error)}
            )
        finally:
            closer = getattr(stream, "aclose", None)
            if closer is not None:
                await closer()

    async def wait(self, timeout_s: float, wake: asyncio.Event) -> list[StreamItem]:
        """Items that are there, waiting up to `timeout_s` for the first (or until `wake` is set)."""
        if self._queue.empty() and not wake.is_set():
            getter = asyncio.ensure_future(self._queue.get())
            waker = asyncio.ensure_future(wake.wait())
            await asyncio.wait((getter, waker), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            waker.cancel()
            if not getter.done():
                getter.cancel()
                return self._drain([])
            return self._drain([getter.result()])
        return self._drain([])

    def events(self, items: list[StreamItem]) -> list[HermesEvent]:
        return [item for item in items if isinstance(item, HermesEvent)]

    def _drain(self, items: list[StreamItem]) -> list[StreamItem]:
        while not self._queue.empty():
            items.append(self._queue.get_nowait())
        if any(not isinstance(item, HermesEvent) for item in items):
            self.ended = True  # StreamEnded, or the stream could not be opened
        return items

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
