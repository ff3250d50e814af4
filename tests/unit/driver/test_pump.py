"""A runner's waits (broker/driver/pump.py): a follow waits for the stream's next items, a nudge or its poll
interval, whichever comes first, and takes every item already read at once; a sleep ends early on a nudge."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

from broker.driver.pump import Nudge, Pump
from broker.hermes.client import HermesClient
from broker.hermes.models import Comment, HermesEvent, StreamEnded, StreamItem

LONG_S = 60.0  #: a wait that must end on something else than its timeout


class Stream:
    """A Hermes client whose one event stream yields what the test feeds it."""

    def __init__(self) -> None:
        self.items: asyncio.Queue[list[StreamItem]] = asyncio.Queue()

    async def events(self, run_id: str, *, idle_timeout_s: float) -> AsyncIterator[StreamItem]:
        while True:
            for item in await self.items.get():  # the items of one read: yielded without a pause
                yield item
                if isinstance(item, StreamEnded):
                    return


def _event(n: int) -> HermesEvent:
    return HermesEvent("message.delta", {"event": "message.delta", "delta": str(n)})


async def test_a_follow_takes_every_item_read_so_far_and_skips_comments() -> None:
    stream = Stream()
    pump = Pump(cast(HermesClient, stream), 1, "run_1")
    try:
        stream.items.put_nowait([_event(1), Comment("keepalive"), _event(2)])
        first = await pump.wait(LONG_S, Nudge())
        assert first == [_event(1), _event(2)] and not pump.ended

        stream.items.put_nowait([_event(3), StreamEnded(clean=True)])
        last = await pump.wait(LONG_S, Nudge())
        assert last == [_event(3), StreamEnded(clean=True)] and pump.ended
    finally:
        await pump.close()


async def test_a_follow_ends_on_a_nudge_or_its_interval_with_nothing() -> None:
    stream = Stream()
    pump = Pump(cast(HermesClient, stream), 1, "run_1")
    wake = Nudge()
    try:
        assert await pump.wait(0.001, wake) == []  # the poll interval passed

        waiting = asyncio.create_task(pump.wait(LONG_S, wake))
        await asyncio.sleep(0)
        wake.set()
        assert await waiting == [] and wake.is_set()
        assert await pump.wait(LONG_S, wake) == []  # still set: no wait at all
    finally:
        await pump.close()


async def test_a_sleep_ends_early_on_a_nudge() -> None:
    wake = Nudge()
    assert not await wake.sleep(0.001)
    sleeping = asyncio.create_task(wake.sleep(LONG_S))
    await asyncio.sleep(0)
    wake.set()
    assert await sleeping
    wake.clear()
    assert not wake.is_set()
