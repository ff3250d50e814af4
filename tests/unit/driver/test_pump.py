"""A runner's waits (broker/driver/pump.py): a follow waits for the stream's next items, a nudge or its poll
interval, whichever comes first, and takes every item already read at once; a sleep ends early on a nudge."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import cast

from broker.driver.pump import MOST_PER_WRITE, Nudge, Pump
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


def _done() -> HermesEvent:
    return HermesEvent("run.completed", {"event": "run.completed", "output": "012"})


async def test_streamed_text_waits_for_the_next_events_and_goes_out_in_one_write() -> None:
    stream = Stream()
    pump = Pump(cast(HermesClient, stream), 1, "run_1", linger_s=LONG_S)
    try:
        waiting = asyncio.create_task(pump.wait(LONG_S, Nudge()))
        for n in range(3):  # read one by one, as Hermes streams them
            stream.items.put_nowait([_event(n)])
            await asyncio.sleep(0.005)
        assert not waiting.done()  # deltas wait for more
        stream.items.put_nowait([_done()])  # a terminal event may not wait: it goes now, with them
        assert await waiting == [_event(0), _event(1), _event(2), _done()]
    finally:
        await pump.close()


async def test_the_linger_ends_after_its_time_on_a_nudge_or_when_the_stream_ends() -> None:
    stream = Stream()
    pump = Pump(cast(HermesClient, stream), 1, "run_1", linger_s=0.01)
    try:
        stream.items.put_nowait([_event(1)])
        assert await pump.wait(LONG_S, Nudge()) == [_event(1)]  # nothing followed within 10 ms
    finally:
        await pump.close()

    stream = Stream()
    pump = Pump(cast(HermesClient, stream), 1, "run_1", linger_s=LONG_S)
    wake = Nudge()
    try:
        stream.items.put_nowait([_event(1)])
        waiting = asyncio.create_task(pump.wait(LONG_S, wake))
        await asyncio.sleep(0.005)
        assert not waiting.done()
        wake.set()  # a stop: the runner looks at once, with what it read
        assert await waiting == [_event(1)]

        stream.items.put_nowait([_event(2), StreamEnded(clean=False)])
        assert await pump.wait(LONG_S, Nudge()) == [_event(2), StreamEnded(clean=False)] and pump.ended
    finally:
        await pump.close()


async def test_a_long_burst_stops_waiting_at_the_most_one_write_takes() -> None:
    stream = Stream()
    pump = Pump(cast(HermesClient, stream), 1, "run_1", linger_s=LONG_S)
    try:
        stream.items.put_nowait([_event(n) for n in range(MOST_PER_WRITE + 3)])  # one read, unpaced
        assert len(await pump.wait(LONG_S, Nudge())) >= MOST_PER_WRITE
        stream.items.put_nowait([_event(1)])
        waiting = asyncio.create_task(pump.wait(LONG_S, Nudge()))
        await asyncio.sleep(0.005)
        assert not waiting.done()
        assert pump.take() == [_event(1)]  # a runner that stops takes what was read, without waiting
        waiting.cancel()
    finally:
        await pump.close()


async def test_an_event_after_a_quiet_linger_goes_at_once() -> None:
    stream = Stream()
    pump = Pump(cast(HermesClient, stream), 1, "run_1", linger_s=0.05)
    try:
        stream.items.put_nowait([_event(1)])
        assert await pump.wait(LONG_S, Nudge()) == [_event(1)]  # read right after the pump opened: it waited
        await asyncio.sleep(0.06)  # a slow stream: nothing for longer than the linger
        stream.items.put_nowait([_event(2)])
        waiting = asyncio.create_task(pump.wait(LONG_S, Nudge()))
        await asyncio.sleep(0.001)
        stream.items.put_nowait([_event(3)])  # would have joined it, had it waited
        assert await waiting == [_event(2)]
        assert await pump.wait(LONG_S, Nudge()) == [_event(3)]  # within the linger of the last take: it waited
    finally:
        await pump.close()
