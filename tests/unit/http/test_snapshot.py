"""This replica's read of the line's figures (broker/http/snapshot.py): /metrics takes a recent one, reads that
overlap share one, /readyz always reads afresh."""

from __future__ import annotations

import asyncio

from broker.admission.state import LineState
from broker.http.snapshot import LineSnapshot


def _state(waiting: int) -> LineState:
    return LineState(limit=2, learnt=True, live=0, waiting=waiting, oldest_wait_ms=None)


class Reads:
    def __init__(self) -> None:
        self.count = 0
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self) -> LineState:
        self.count += 1
        await self.gate.wait()
        return _state(self.count)


async def test_a_recent_read_is_taken_and_a_fresh_one_always_reads() -> None:
    snapshot, reads = LineSnapshot(max_age_s=60), Reads()
    assert (await snapshot.fresh(reads)).waiting == 1
    assert (await snapshot.recent(reads)).waiting == 1  # /metrics beside /readyz: no read
    assert (await snapshot.fresh(reads)).waiting == 2
    assert (await snapshot.recent(reads)).waiting == 2 and reads.count == 2


async def test_an_old_read_is_read_again_and_overlapping_reads_share_one() -> None:
    snapshot, reads = LineSnapshot(max_age_s=0), Reads()
    reads.gate.clear()
    waiting = [asyncio.ensure_future(snapshot.recent(reads)) for _ in range(3)]
    await asyncio.sleep(0)
    reads.gate.set()
    assert [state.waiting for state in await asyncio.gather(*waiting)] == [1, 1, 1]
    assert (await snapshot.recent(reads)).waiting == 2  # older than max_age_s: read again
