"""The job store's creates and ends under `ADMISSION_FAIRNESS_COST` `time` (SPEC S4.2 "What a turn costs";
broker/store/cost_entry.py): a key's first waiting job is its front in the line with its fronts entry, the others are
parked and counted; a stop takes a job off the parked jobs or the line and its key's queue, and a stopped front is
followed by the key's next job; `runs` writes nothing of it."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis

from broker.admission import fair
from broker.admission.cost import CostMode, CostSettings, History
from broker.admission.pacing import Pacing
from broker.admission.quotas import Bound
from broker.errors import QueueFull
from broker.events import JobCreated, JobFinished, JobStatus, RunAccepted, Scheduling, StopRequested
from broker.jobs.usage import UsageSweep
from broker.metrics import Metrics
from broker.store import keys, signals
from broker.store.admission import AdmissionStore
from broker.store.cost_entry import CostEntry
from broker.store.cost_store import CostStore, entry_of
from broker.store.jobs import JobStore
from broker.store.usage import UsageStore, encode
from projections import usage
from projections.job import JobView, apply, fold
from projections.usage import Used
from tests.conftest import BOTH_BACKENDS

pytestmark = BOTH_BACKENDS

TIME = CostSettings(CostMode.TIME, 60_000)
P = 3


def _job(n: int) -> str:
    return f"job_{n:032x}"


async def _create(store: JobStore, n: int, key: str, bound: Bound | None = None) -> JobView:
    scheduling = Scheduling(priority=P, fairness_key=key)
    event = JobCreated(job_id=_job(n), at_ms=1_000 + n, body="{}", fingerprint=str(n), scheduling=scheduling)
    view = apply(None, event)
    assert view is not None
    await store.create(event, view, bound=bound)
    return view


async def _stop(store: JobStore, n: int) -> None:
    snapshot = await store.load(_job(n))
    assert snapshot is not None
    stop = StopRequested(job_id=_job(n), at_ms=5_000)
    finished = JobFinished(job_id=_job(n), at_ms=5_000, status=JobStatus.CANCELLED, error_code="stopped")
    view = fold([stop, finished], snapshot.view)
    assert view is not None
    await store.append(_job(n), [stop, finished], view, expected_last_id=None, before=snapshot.view)


async def _where(redis: Redis, n: int) -> tuple[str, float | None]:
    p = keys.partition_of(_job(n))
    line, parked = await redis.zscore(keys.line(p), _job(n)), await redis.zscore(keys.parked(p), _job(n))
    assert line is None or parked is None
    return ("line", line) if line is not None else ("parked", parked) if parked is not None else ("none", None)


async def _waiting(redis: Redis, key: str) -> int:
    total = 0
    for p in keys.partitions():
        total += int(await redis.hget(keys.fair(p), f"n:{key}") or 0)
    return total


async def test_a_keys_first_job_is_its_front_and_the_others_park_counted(redis: Redis) -> None:
    # Given a job store charging slot time
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    # When a key creates three jobs and another key one
    for n in range(3):
        await _create(store, n, "team-a")
    await _create(store, 3, "team-b")
    # Then each key's first job is in the line at the line's V (0 here), with its fronts entry (the guess), and the
    # others are parked in arrival order, all counted as waiting
    assert await _where(redis, 0) == ("line", fair.score(P, 0))
    assert await _where(redis, 3) == ("line", fair.score(P, 0))
    entry = await redis.hget(keys.fronts(keys.partition_of(_job(0))), _job(0))
    assert entry is not None and entry_of(entry).advance == 60_000 and entry_of(entry).key == "team-a"
    assert [(await _where(redis, n))[0] for n in (1, 2)] == ["parked", "parked"]
    line = await CostStore(redis, TIME, 60_000).key_line("team-a", P)
    assert line.front == _job(0) and line.queue == (_job(0), _job(1), _job(2))
    assert (await _waiting(redis, "team-a"), await _waiting(redis, "team-b")) == (3, 1)
    # and what /readyz shows counts the parked jobs as waiting in their priority
    state = await AdmissionStore(redis, Pacing()).state(2_000)
    assert (state.waiting, state.by_priority[P - 1]) == (4, 4)
    assert {(k.key, k.waiting) for k in state.keys} == {("team-a", 3), ("team-b", 1)}


async def test_a_stopped_front_is_followed_by_its_keys_next_job_and_a_parked_one_leaves(redis: Redis) -> None:
    # Given a key's front and two parked jobs
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    for n in range(3):
        await _create(store, n, "team-a")
    # When the middle (parked) job is stopped, then the front
    await _stop(store, 1)
    assert await _where(redis, 1) == ("none", None)
    await _stop(store, 0)
    # Then the last job is the key's front, in the line at the key's F (nothing was charged) with its entry
    assert await _where(redis, 0) == ("none", None)
    assert await _where(redis, 2) == ("line", fair.score(P, 0))
    assert await redis.hget(keys.fronts(keys.partition_of(_job(0))), _job(0)) is None
    assert await redis.hget(keys.fronts(keys.partition_of(_job(2))), _job(2)) is not None
    line = await CostStore(redis, TIME, 60_000).key_line("team-a", P)
    assert line.front == _job(2) and line.queue == (_job(2),)
    assert await _waiting(redis, "team-a") == 1


async def test_a_create_refused_by_a_bound_leaves_no_trace_in_its_keys_queue(redis: Redis) -> None:
    # Given a key at its waiting quota of one
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    bound = Bound(key=1)
    await _create(store, 0, "team-a", bound)
    # When its next create is refused
    with pytest.raises(QueueFull):
        await _create(store, 1, "team-a", bound)
    # Then the key's queue holds its first job only
    line = await CostStore(redis, TIME, 60_000).key_line("team-a", P)
    assert line.queue == (_job(0),) and await _where(redis, 1) == ("none", None)


async def test_a_front_at_v_tells_the_passes_its_score_and_pacing_and_a_replay_takes_no_second_turn(
    redis: Redis,
) -> None:
    # Given a job store charging slot time, the line's V at 0, and a listener of the creates' messages
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    heard: list[str] = []
    listening = asyncio.Event()

    async def listen() -> None:
        async for message in signals.nudges(redis, listening.set):
            heard.append(message)

    listener = asyncio.create_task(listen())
    await asyncio.wait_for(listening.wait(), 10)
    try:
        # When a key creates two jobs, and its first create is replayed
        await _create(store, 0, "team-a")
        await _create(store, 1, "team-a")
        await _create(store, 0, "team-a")
        async with asyncio.timeout(10):
            while len(heard) < 2:
                await asyncio.sleep(0.01)
    finally:
        listener.cancel()
    # Then its front, at V, told every pass its score and what V moves past it by (the guess: no run settled yet),
    # its parked job said it joined, and the replay published nothing and queued the job no second time
    assert heard[0] == signals.newcomer_message(_job(0), fair.score(P, 0), 60_000)
    assert heard[1:] == [signals.joined_message(_job(1))]
    line = await CostStore(redis, TIME, 60_000).key_line("team-a", P)
    assert line.front == _job(0) and line.queue == (_job(0), _job(1))
    assert (await _where(redis, 0), (await _where(redis, 1))[0]) == (("line", fair.score(P, 0)), "parked")
    assert await _waiting(redis, "team-a") == 2


async def test_runs_keeps_fixed_tags_and_writes_no_queue(redis: Redis) -> None:
    # Given a store configured `runs`
    store = JobStore(redis, retention_ms=60_000, cost=CostSettings(CostMode.RUNS))
    # When a key creates two jobs
    await _create(store, 0, "team-a")
    await _create(store, 1, "team-a")
    # Then both are in the line one turn apart (fair.advance), nothing parked, no queue, no fronts
    assert await _where(redis, 0) == ("line", fair.score(P, 0))
    assert await _where(redis, 1) == ("line", fair.score(P, fair.UNIT))
    assert (await CostStore(redis, TIME, 60_000).key_line("team-a", P)).queue == ()
    assert not await redis.exists(keys.fronts(keys.partition_of(_job(0))))


async def test_an_idle_key_reenters_at_v_banking_nothing(redis: Redis) -> None:
    # Given a key whose one run was charged the guess and took 1 ms (59.999 s back, while it has nothing waiting)
    virtual = fair.VirtualTimes()
    store = JobStore(redis, retention_ms=60_000, cost=TIME, virtual=virtual)
    admission = AdmissionStore(redis, Pacing(pinned=10), virtual=virtual, cost=(TIME, 60_000))
    first = await _create(store, 0, "idle")
    assert (await admission.admit(2_000, 10)).jobs == [_job(0)]
    fact = Used(marker=f"{_job(0)}:1:i", key="idle", at_ms=3_000, hermes_ms=1)
    entry = CostEntry(redis, TIME, 60_000)
    await entry.written(first, first, [(fact.at_ms, encode(fact))], virtual.tag(P))
    # and another key's backlog granted meanwhile (V moves past its tags)
    for n in range(1, 4):
        await _create(store, n, "busy")
    assert len((await admission.admit(4_000, 10)).jobs) == 3
    now = virtual.tag(P)
    assert now > 60_000
    # When the idle key creates again
    await _create(store, 9, "idle")
    # Then its job starts at V, not at its corrected chain (no banked credit), and is its key's front
    assert await _where(redis, 9) == ("line", fair.score(P, now))


async def _run(store: JobStore, n: int, accepted_ms: int, ended_ms: int) -> None:
    """The job's run: accepted at `accepted_ms`, completed at `ended_ms`, each written with its usage facts as the
    writer does (broker/jobs/writer.py)."""
    for events in (
        [RunAccepted(job_id=_job(n), at_ms=accepted_ms, attempt=1, hermes_run_id=f"run_{n}")],
        [JobFinished(job_id=_job(n), at_ms=ended_ms, status=JobStatus.COMPLETED, output="ok")],
    ):
        snapshot = await store.load(_job(n))
        assert snapshot is not None
        view = fold(events, snapshot.view)
        assert view is not None
        facts = [(used.at_ms, encode(used)) for used in usage.facts(snapshot.view, events)]
        await store.append(_job(n), events, view, expected_last_id=None, before=snapshot.view, usage=facts)


async def test_a_runs_settle_lost_after_its_job_write_is_done_by_the_usage_sweep(redis: Redis) -> None:
    # A run's settle is a round trip after the job write that records the run's end with its usage fact: a replica
    # that dies between the two (or an outage then, or the key's slot's node failing over on a cluster) leaves its
    # key charged the estimate, its History not learnt and the charge in flight for good (SPEC S4.2: the estimate is
    # corrected by the measured time when the run settles). The usage sweep counts that fact, and settles it.
    virtual = fair.VirtualTimes()
    store = JobStore(redis, retention_ms=60_000, cost=TIME, virtual=virtual)
    admission = AdmissionStore(redis, Pacing(pinned=10), virtual=virtual, cost=(TIME, 60_000))
    costs = CostStore(redis, TIME, 60_000)
    await _create(store, 0, "team-a")
    await _create(store, 1, "team-a")
    # Given the key's first job granted (charged the guess)
    assert (await admission.admit(2_000, 1)).jobs == [_job(0)]
    assert await costs.charge("team-a", _job(0)) is not None
    # When its run (1 s) is written to its end by a replica that dies before the settle (a store without the cost
    # entry writes the same job writes, and settles nothing)
    await _run(JobStore(redis, retention_ms=60_000, virtual=virtual), 0, 3_000, 4_000)
    assert await costs.charge("team-a", _job(0)) is not None
    # and a replica's usage sweep counts the run
    sweep = UsageSweep(UsageStore(redis, retention_ms=60_000), Metrics(), settle=store.settle_missed)
    assert await sweep.sweep() == 2
    # Then the run's charge is settled: corrected by what it measured (a credit down to one turn behind V, the guess
    # having moved V), learnt by the key's History, and the key's front moved to its corrected turn
    assert await costs.charge("team-a", _job(0)) is None
    assert await costs.history("team-a") == History(1_000.0, 1)
    line = await costs.key_line("team-a", P)
    assert line.placed is not None and line.placed.job == _job(1) and line.finish == 60_000 - 1_000
    assert await _where(redis, 1) == ("line", fair.score(P, line.placed.tag))
