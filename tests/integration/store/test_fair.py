"""The fair line in Redis (SPEC S4.2): fair_turn.lua and the job write place creates exactly as the pure model does,
the grant keeps V, the counts of waiting jobs per key follow the line (create, claim, stop, re-entry) and go away
with it. Real Redis, both backends."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable

import pytest
from redis.asyncio import Redis

from broker.admission import fair
from broker.admission.fair import FairLine
from broker.admission.pacing import Pacing
from broker.events import HoldReason, JobCreated, JobFinished, JobStatus, Scheduling, StopRequested
from broker.store import keys, signals
from broker.store.admission import AdmissionStore
from broker.store.jobs import JobStore
from projections.job import apply, fold
from tests.conftest import BOTH_BACKENDS

pytestmark = BOTH_BACKENDS

T0 = 1_800_000_000_000


def job_id(i: int) -> str:
    return f"job_{i:032x}"


async def create(store: JobStore, i: int, scheduling: Scheduling, at_ms: int = T0) -> None:
    event = JobCreated(job_id=job_id(i), at_ms=at_ms, body='{"input":"x"}', fingerprint="f", scheduling=scheduling)
    view = apply(None, event)
    assert view is not None
    assert (await store.create(event, view)).created


async def place(redis: Redis, i: int) -> float | None:
    score: float | None = await redis.zscore(keys.line(keys.partition_of(job_id(i))), job_id(i))
    return score


async def test_creates_get_the_places_of_the_pure_model(redis: Redis) -> None:
    for seed in range(3):
        await redis.delete(*[keys.turns(p, q) for p in keys.partitions() for q in fair.PRIORITIES])
        rng = random.Random(seed)
        virtual = fair.VirtualTimes()
        store = JobStore(redis, retention_ms=600_000, virtual=virtual)
        model = FairLine()
        v = [0] * len(fair.PRIORITIES)
        for i in range(40):
            scheduling = Scheduling(
                priority=rng.choice(fair.PRIORITIES),
                fairness_key=rng.choice(["", "a", "b", "team-c", "u" * 200]),
                fairness_weight=rng.choice([0.001, 0.3, 1.0, 2.5, 7.0, 1_000.0]),
            )
            if rng.random() < 0.3:  # the line moved on: this replica learnt a larger V
                v[scheduling.priority - 1] += rng.randrange(0, 50_000)
            virtual.learn(v, T0)
            expected = model.enter(job_id(seed * 100 + i), scheduling, 0, virtual=virtual.tag(scheduling.priority))
            await create(store, seed * 100 + i, scheduling)
            assert await place(redis, seed * 100 + i) == expected, (seed, i, scheduling)


async def test_the_grant_keeps_v_and_every_pass_returns_it(redis: Redis) -> None:
    # Given three jobs of priority 2 of one key, placed at tags 0, 10000, 20000
    store = JobStore(redis, retention_ms=600_000)
    for i in range(3):
        await create(store, i, Scheduling(priority=2, fairness_key="k"))
    admission = AdmissionStore(redis, Pacing(pinned=2))
    # When a pass grants two of them
    grants = await admission.admit(T0, 5)
    assert grants.jobs == [job_id(0), job_id(1)]
    # Then V of priority 2 follows the line to the tag still waiting, and the next pass brings it to this replica
    assert await redis.hget(keys.ADMISSION_STATE, "v2") == "20000"
    await admission.admit(T0 + 1, 5)
    assert admission.virtual.tag(2) == 20_000 and admission.virtual.tag(3) == 0
    # and a replica that creates reads it when its own is stale: a new key starts at V, beside k's next job (which
    # arrived first, so goes first)
    late = JobStore(redis, retention_ms=600_000)
    await create(late, 10, Scheduling(priority=2, fairness_key="late"), at_ms=T0 + 5_000)
    assert await place(redis, 10) == fair.score(2, 20_000) == await place(redis, 2)


async def test_counts_of_waiting_jobs_follow_the_line_and_go_away_with_it(redis: Redis) -> None:
    store = JobStore(redis, retention_ms=600_000)
    admission = AdmissionStore(redis, Pacing(pinned=1))
    # Given jobs of two keys and of two priorities
    await create(store, 1, Scheduling(priority=1, fairness_key="a", fairness_weight=2.0))
    await create(store, 2, Scheduling(fairness_key="a", fairness_weight=2.0))
    await create(store, 3, Scheduling(fairness_key="b"))
    line = await admission.state(T0 + 1_000)
    assert line.keys == (fair.KeyLoad("a", 2, 2.0), fair.KeyLoad("b", 1, 1.0))
    assert line.by_priority == (1, 0, 2, 0, 0) and line.ahead == 0 and line.waiting == 3
    assert line.oldest_wait_ms == 1_000  # from the listing's queued index
    # When the first is granted (claimed off the line), b's job is stopped while it waits, and the granted one
    # goes back in line (a refusal)
    assert (await admission.admit(T0, 5)).jobs == [job_id(1)]
    snapshot = await store.load(job_id(3))
    assert snapshot is not None
    stop = [
        StopRequested(job_id=job_id(3), at_ms=T0 + 1),
        JobFinished(job_id=job_id(3), at_ms=T0 + 1, status=JobStatus.CANCELLED, error_code="stopped"),
    ]
    stopped = fold(stop, snapshot.view)
    assert stopped is not None
    await store.append(job_id(3), stop, stopped, expected_last_id=snapshot.last_id, before=snapshot.view)
    assert (await admission.state(T0)).keys == (fair.KeyLoad("a", 1, 2.0),)
    await admission.requeue(job_id(1), "0")
    assert (await admission.state(T0)).keys == (fair.KeyLoad("a", 2, 2.0),)
    await admission.enter(job_id(1), "0")  # there already: counted once
    assert (await admission.state(T0)).keys == (fair.KeyLoad("a", 2, 2.0),)
    # Then once the line is empty, no count is left behind
    await redis.delete(keys.lease(job_id(1)))
    admission = AdmissionStore(redis, Pacing(pinned=5))
    assert sorted((await admission.admit(T0 + 10, 5)).jobs) == [job_id(1), job_id(2)]
    assert [await redis.exists(keys.fair(p)) for p in keys.partitions()] == [0] * keys.PARTITIONS
    assert (await admission.state(T0)).keys == ()


async def test_a_pass_forgets_counts_left_in_an_empty_line(redis: Redis) -> None:
    # Given counts an older broker's scripts left behind (they do not count), with an empty line
    partition = keys.partition_of(job_id(7))
    await redis.hset(keys.fair(partition), mapping={"n:ghost": "4", "w:ghost": "1.0"})  # type: ignore[misc]
    assert (await AdmissionStore(redis, Pacing()).state(T0)).keys == (fair.KeyLoad("ghost", 4, 1.0),)
    # When a pass reads every partition (a job waits elsewhere, so the pass gets that far)
    await create(
        JobStore(redis, retention_ms=600_000), 8 if keys.partition_of(job_id(8)) != partition else 9, Scheduling()
    )
    admission = AdmissionStore(redis, Pacing(pinned=1))
    await admission.admit(T0, 5)
    # Then they are gone
    assert not await redis.exists(keys.fair(partition))


async def test_a_legacy_line_entry_goes_ahead_of_every_band(redis: Redis) -> None:
    # Given a first attempt an older broker placed (created ms * 1000) and a resubmit, beside new creates
    store = JobStore(redis, retention_ms=600_000)
    await create(store, 1, Scheduling(priority=1, fairness_key="a"))
    await create(store, 2, Scheduling())
    for i, score in ((3, T0 * 1000), (4, T0)):
        await redis.zadd(keys.line(keys.partition_of(job_id(i))), {job_id(i): score})
    admission = AdmissionStore(redis, Pacing(pinned=4))
    line = await admission.state(T0)
    assert line.ahead == 2 and line.by_priority == (1, 0, 1, 0, 0)
    # When a pass grants all, Then the resubmit and the legacy job go first, then the priorities
    assert (await admission.admit(T0, 4)).jobs == [job_id(4), job_id(3), job_id(1), job_id(2)]


async def test_jobs_of_one_start_tag_go_oldest_first_even_after_a_refusal(redis: Redis) -> None:
    # Given three one-job keys created at one V (one start tag), in arrival order 0, 1, 2
    store = JobStore(redis, retention_ms=600_000)
    for i in range(3):
        await create(store, i, Scheduling(fairness_key=f"user-{i}"), at_ms=T0 + i)
    admission = AdmissionStore(redis, Pacing(pinned=1))
    # When the oldest is granted, refused by Hermes (back in line at its place), and the line moves again
    assert (await admission.admit(T0 + 10, 5)).jobs == [job_id(0)]
    await admission.refused(
        job_id(0), T0 + 20, reason=HoldReason.BUSY, detail="Full.", retry_after_ms=None, jitter=0.0, place="0"
    )
    await redis.delete(keys.lease(job_id(0)))
    await redis.hset(keys.ADMISSION_STATE, "refusing", "")  # type: ignore[misc]
    # Then it is still the first of its tag (its created ms, not its last change), then 1, then 2
    assert (await admission.admit(T0 + 30, 5)).jobs == [job_id(0)]
    await admission.release(job_id(0), freed=True)
    assert (await admission.admit(T0 + 40, 5)).jobs == [job_id(1)]
    # and a waiting job keeps its arrival until it ends
    arrivals = keys.arrivals(keys.partition_of(job_id(2)))
    assert await redis.zscore(arrivals, job_id(2)) == T0 + 2
    snapshot = await store.load(job_id(2))
    assert snapshot is not None
    stop = [
        StopRequested(job_id=job_id(2), at_ms=T0 + 50),
        JobFinished(job_id=job_id(2), at_ms=T0 + 50, status=JobStatus.CANCELLED, error_code="stopped"),
    ]
    stopped = fold(stop, snapshot.view)
    assert stopped is not None
    await store.append(job_id(2), stop, stopped, expected_last_id=snapshot.last_id, before=snapshot.view)
    assert await redis.zscore(arrivals, job_id(2)) is None


async def test_a_create_that_starts_at_v_says_so_to_every_replica(redis: Redis) -> None:
    # Given a replica listening to the line's messages
    store = JobStore(redis, retention_ms=600_000)
    heard: list[str] = []
    listening = asyncio.Event()
    listener = asyncio.create_task(_listen(redis, heard, listening))
    await asyncio.wait_for(listening.wait(), 10)
    try:
        # When key k creates two jobs (the first starts at V, the second at k's turn) and key w one of weight 4
        await create(store, 1, Scheduling(priority=2, fairness_key="k"))
        await create(store, 2, Scheduling(priority=2, fairness_key="k"))
        await create(store, 3, Scheduling(fairness_key="w", fairness_weight=4.0))
        await _until(lambda: len(heard) == 3)
    finally:
        listener.cancel()
    # Then the newcomers' messages carry their places (at V) and advances; every message names its job (on a
    # cluster the nodes' messages may come in another order)
    assert {signals.joined(m): signals.newcomer(m) for m in heard} == {
        job_id(1): (job_id(1), fair.score(2, 0), 10_000),
        job_id(2): None,
        job_id(3): (job_id(3), fair.score(3, 0), 2_500),
    }


@pytest.mark.parametrize("replicas", [1, 2])
async def test_a_backlogged_key_keeps_half_the_starts_against_a_new_key_per_start(redis: Redis, replicas: int) -> None:
    # Given key A's 40 waiting jobs and replicas that create and admit in turn (room for 2 runs), each hearing the
    # line's messages as a broker does
    stores = []
    for _ in range(replicas):
        virtual = fair.VirtualTimes()
        stores.append(
            (JobStore(redis, retention_ms=600_000, virtual=virtual), AdmissionStore(redis, Pacing(pinned=2), virtual))
        )
    for i in range(40):
        await create(stores[0][0], i, Scheduling(fairness_key="A"), at_ms=T0 + i)
    heard: list[str] = []
    listening = asyncio.Event()
    listener = asyncio.create_task(_listen(redis, heard, listening))
    await asyncio.wait_for(listening.wait(), 10)
    started: list[str] = []
    try:
        # When a run settles and a new one-job key arrives before every pass, 56 times (created on one replica,
        # admitted by the next)
        for n in range(56):
            creator, admission = stores[n % replicas][0], stores[(n + 1) % replicas][1]
            if len(started) >= 2:
                await admission.release(started[-2], freed=True)
            await create(creator, 1_000 + n, Scheduling(fairness_key=f"new-{n}"), at_ms=T0 + 100 + n)
            await _until(lambda n=n: any(job_id(1_000 + n) in m for m in heard))  # type: ignore[misc]
            for message, (_, replica) in itertools.product(heard, stores):
                entered = signals.newcomer(message)
                replica.heard(signals.joined(message) or "", None if entered is None else entered[1:])
            heard.clear()
            started += (await admission.admit(T0 + 200 + n, 2)).jobs
    finally:
        listener.cancel()
    # Then A got about half of the starts (29 of 57; with V one past each grant, 1 of 57), in its own order
    mine = [job for job in started if job < job_id(1_000)]
    assert len(mine) >= 0.35 * len(started), (len(mine), len(started))
    assert mine == sorted(mine)


async def _listen(redis: Redis, heard: list[str], listening: asyncio.Event) -> None:
    async for message in signals.nudges(redis, subscribed=listening.set):
        heard.append(message)


async def _until(done: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll `done` until it holds (the pub/sub message is on its way), failing after `seconds`."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not done():
        assert asyncio.get_running_loop().time() < deadline, "not heard in time"
        await asyncio.sleep(0.01)
