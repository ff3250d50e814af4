"""The cost-aware line in its bad moments (SPEC S4.2 "What a turn costs", S4.4): a crash between two writes, a replay,
a switch back to `runs`, a bound. Single Redis (the default fixture); real redis-server, no mocks of Redis."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from broker.admission.cost import CostMode, CostSettings
from broker.admission.pacing import Pacing
from broker.admission.quotas import Bound
from broker.errors import QueueFull
from broker.events import JobCreated, JobFinished, JobStatus, Scheduling, StopRequested
from broker.store import keys
from broker.store.admission import AdmissionStore
from broker.store.cost_entry import CostEntry
from broker.store.cost_store import CostStore
from broker.store.jobs import JobStore
from projections.job import JobView, apply, fold

TIME = CostSettings(CostMode.TIME, 60_000)
P = 3


def _job(n: int) -> str:
    return f"job_{n:032x}"


def _event(n: int, key: str) -> tuple[JobCreated, JobView]:
    event = JobCreated(
        job_id=_job(n),
        at_ms=1_000 + n,
        body="{}",
        fingerprint=str(n),
        scheduling=Scheduling(priority=P, fairness_key=key),
    )
    view = apply(None, event)
    assert view is not None
    return event, view


async def _create(store: JobStore, n: int, key: str, bound: Bound | None = None) -> JobView:
    event, view = _event(n, key)
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


async def test_max_waiting_counts_parked_jobs(redis: Redis) -> None:
    # SPEC S4.4: ADMISSION_MAX_WAITING bounds ALL waiting jobs together. In cost mode a key's jobs behind its front
    # are parked (not in `line`), and the bound counts ZCARD(line) only.
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    bound = Bound(all=2)
    await _create(store, 0, "team-a", bound)
    await _create(store, 1, "team-a", bound)
    with pytest.raises(QueueFull):  # the third waiting job passes a bound of 2
        for n in range(2, 6):
            await _create(store, n, "team-a", bound)


async def test_a_create_whose_job_write_never_happened_strands_its_keys_later_jobs(redis: Redis) -> None:
    # A create that ran fair_turn_cost.lua and then died (process killed, OOM refusing the job write, outage) leaves a
    # job id in the key's queue as its front, in no line. The key's next (acknowledged) job is parked behind it; with
    # another key backlogged, passes with room never grant it (SPEC S4.2 fair shares: a key with a few jobs starts
    # within about one round).
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    _, ghost = _event(99, "team-a")
    await CostEntry(redis, TIME, 60_000).enter(_job(99), ghost, 0)  # the create's first write only
    await _create(store, 0, "team-a")  # acknowledged, 202
    for n in range(1, 12):
        await _create(store, n, "team-b")
    admission = AdmissionStore(redis, Pacing(pinned=4), cost=(TIME, 60_000))
    granted = (await admission.admit(2_000, 4)).jobs
    line = await CostStore(redis, TIME, 60_000).key_line("team-a", P)
    assert _job(0) in granted, (granted, line.front)


async def test_switching_cost_back_to_runs_grants_parked_jobs(redis: Redis) -> None:
    # A store with jobs waiting under `time` (a key's later jobs parked), then ADMISSION_FAIRNESS_COST=runs (or a
    # rollback to the previous main): LineClaims reads `line` only and nothing unparks, so the parked jobs are never
    # granted (SPEC S4.1: a later job never gets a run while an earlier one waits; nothing idles).
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    for n in range(3):
        await _create(store, n, "team-a")
    runs = AdmissionStore(redis, Pacing(pinned=5), cost=(CostSettings(CostMode.RUNS), 60_000))
    granted: list[str] = []
    for at in range(3):
        granted += (await runs.admit(2_000 + at, 5)).jobs
    assert granted == [_job(0), _job(1), _job(2)]


async def test_a_granted_job_stopped_before_hermes_took_it_costs_nothing(redis: Redis) -> None:
    # SPEC S4.2 `time`: a key is charged the Hermes time its run held a slot, estimated until the run settles. A job
    # granted then stopped before Hermes accepted it held no slot; its charge (the 60 s guess) is never corrected:
    # `c:<job>` stays and the key idles with a 60 s debt ahead of V.
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    await _create(store, 0, "team-a")
    granted = (await AdmissionStore(redis, Pacing(pinned=5), cost=(TIME, 60_000)).admit(2_000, 5)).jobs
    assert granted == [_job(0)]
    await _stop(store, 0)
    names = keys.cost_keys("team-a", P)
    assert await redis.hget(names.history, f"c:{_job(0)}") is None
    assert (await redis.zscore(names.turns, "team-a") or 0) <= 1  # no debt past a charge's floor (1 unit)


async def test_control_without_a_ghost_the_key_is_granted_in_the_first_pass(redis: Redis) -> None:
    # The control of the ghost test above: the same line without the dead create grants team-a's job at once.
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    await _create(store, 0, "team-a")
    for n in range(1, 12):
        await _create(store, n, "team-b")
    granted = (await AdmissionStore(redis, Pacing(pinned=4), cost=(TIME, 60_000)).admit(2_000, 4)).jobs
    assert _job(0) in granted


async def test_a_replica_dying_between_its_claims_and_the_key_steps_strands_the_keys_next_jobs(redis: Redis) -> None:
    # Design 8 row "claim and fair_next": the claimed job stays its key's front in the key's queue, the key's next job
    # parked. Nothing but that job's own settle (a whole run later) or a fallback round repairs it: no takeover step,
    # no repair slice. Another replica's passes with room meanwhile grant the other key's backlog only.
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    for n in range(3):
        await _create(store, n, "team-a")
    for n in range(3, 15):
        await _create(store, n, "team-b")
    dying = AdmissionStore(redis, Pacing(pinned=1), cost=(TIME, 60_000))

    async def killed(*_: object, **__: object) -> object:
        raise RuntimeError("SIGKILL after the claims")

    dying._line.costs.steps = killed  # type: ignore[attr-defined,method-assign]
    with pytest.raises(RuntimeError):
        await dying.admit(2_000, 1)
    other = AdmissionStore(redis, Pacing(pinned=6), cost=(TIME, 60_000))
    granted: list[str] = []
    for at in range(3):
        granted += (await other.admit(3_000 + at, 6)).jobs
    claimed = _job(0) if _job(0) not in granted else _job(3)
    line = await CostStore(redis, TIME, 60_000).key_line("team-a", P)
    assert _job(1) in granted, (claimed, granted, line.front)


async def test_readyz_waiting_counts_parked_jobs(redis: Redis) -> None:
    # SPEC S4.2 / S3.8: /readyz `admission` and /metrics hbr_admission_waiting{priority} show the waiting jobs by
    # priority. line_figures.lua ZCOUNTs `line` only: a key's parked jobs are not shown as waiting.
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    for n in range(3):
        await _create(store, n, "team-a")
    state = await AdmissionStore(redis, Pacing(pinned=5), cost=(TIME, 60_000)).state(2_000)
    assert (state.waiting, state.by_priority[P - 1]) == (3, 3)


async def test_a_stop_whose_key_step_failed_after_its_write_leaves_the_key_stranded(redis: Redis) -> None:
    # JobStore.append commits the stop, then runs CostEntry.written (fair_next `left`, fair_promote) in the same call:
    # an outage there raises out of `append` (the stop answers 503 though it took effect), and nothing runs the step
    # again (the job is terminal: a retried stop writes nothing; no repair slice). The stopped front stays its key's
    # front; the key's next job stays parked while another key is backlogged.
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    await _create(store, 0, "team-a")
    await _create(store, 1, "team-a")
    for n in range(2, 14):
        await _create(store, n, "team-b")
    cost = store._cost
    assert cost is not None
    real = cost.store.step

    async def outage(*_: object, **__: object) -> object:
        raise ConnectionError("Redis went away after the job write")

    cost.store.step = outage  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await _stop(store, 0)
    cost.store.step = real  # type: ignore[method-assign]
    snapshot = await store.load(_job(0))
    assert snapshot is not None and snapshot.view.status is JobStatus.CANCELLED  # the stop took effect
    granted = (await AdmissionStore(redis, Pacing(pinned=4), cost=(TIME, 60_000)).admit(6_000, 4)).jobs
    assert _job(1) in granted, granted


async def test_a_ghost_front_holds_its_key_back_until_the_other_backlog_drains(redis: Redis) -> None:
    # The ghost of a dead create (as above), passes of 2 slots, each pass's runs released before the next (without
    # their settles: the runs' key steps are the grants'): team-a's only real job waits for team-b's whole backlog.
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    _, ghost = _event(99, "team-a")
    await CostEntry(redis, TIME, 60_000).enter(_job(99), ghost, 0)
    await _create(store, 0, "team-a")
    for n in range(1, 21):
        await _create(store, n, "team-b")
    admission = AdmissionStore(redis, Pacing(pinned=2), cost=(TIME, 60_000))
    passes: list[list[str]] = []
    for at in range(12):
        granted = (await admission.admit(2_000 + at * 10, 2)).jobs
        passes.append(granted)
        for job_id in granted:
            await admission.release(job_id, freed=True)
        if _job(0) in granted:
            break
    at = next((i for i, jobs in enumerate(passes) if _job(0) in jobs), None)
    assert at is not None and at <= 1, (at, [len(jobs) for jobs in passes])


async def _waiting(redis: Redis, key: str) -> int:
    total = 0
    for p in keys.partitions():
        total += int(await redis.hget(keys.fair(p), f"n:{key}") or 0)
    return total


async def test_a_drift_check_keeps_the_counts_of_parked_jobs(redis: Redis) -> None:
    # Design 2: counts (`waiting` quota, /readyz top keys) count parked jobs, and admission_fair_clear.lua "clears
    # counts only when both `line` and `parked` are empty". The script still looks at `line` only: a pass of a replica
    # that reads the line only (ADMISSION_FAIRNESS_COST=runs, or the previous main during a rollout) clears the
    # counts of every partition holding parked jobs and no front.
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    for n in range(4):
        await _create(store, n, "team-a")
    assert await _waiting(redis, "team-a") == 4
    runs = AdmissionStore(redis, Pacing(pinned=1), cost=(CostSettings(CostMode.RUNS), 60_000))
    assert (await runs.admit(2_000, 1)).jobs == [_job(0)]
    assert await _waiting(redis, "team-a") == 3  # the three parked jobs still wait


async def test_a_replayed_create_of_a_granted_queued_job_does_not_requeue_it_in_its_key(redis: Redis) -> None:
    # S3.1.1 idempotency: a replay (same Idempotency-Key, same job id) of a create whose job was already granted and
    # is still `queued` (its Hermes create in flight, waiting for its session or held by its quota) runs
    # fair_turn_cost.lua again: the job is no longer in its key's queue, so it is queued again as the key's front
    # (append_events answers EXISTS, and `left` runs only for a job past `queued`). The key's next create parks
    # behind a job that is in no line.
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    event, view = _event(0, "team-a")
    await store.create(event, view)
    assert (await AdmissionStore(redis, Pacing(pinned=5), cost=(TIME, 60_000)).admit(2_000, 5)).jobs == [_job(0)]
    replay = await store.create(event, view)  # the client's retry of the same create
    assert not replay.created
    await _create(store, 1, "team-a")
    line = await CostStore(redis, TIME, 60_000).key_line("team-a", P)
    assert line.front == _job(1), (line.front, line.queue)


async def test_one_pass_fills_its_room_from_one_backlogged_key(redis: Redis) -> None:
    # SPEC S4.1/S4.2 nothing idles: a pass with room 60 and one key's 60 waiting jobs grants all 60 in key order.
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    for n in range(60):
        await _create(store, n, "team-a")
    granted = (await AdmissionStore(redis, Pacing(pinned=60), cost=(TIME, 60_000)).admit(2_000, 60)).jobs
    assert len(granted) == 60, len(granted)
    assert granted == sorted(granted)


async def test_control_runs_fills_its_room_from_one_backlogged_key(redis: Redis) -> None:
    runs = CostSettings(CostMode.RUNS)
    store = JobStore(redis, retention_ms=60_000, cost=runs)
    for n in range(60):
        await _create(store, n, "team-a")
    granted = (await AdmissionStore(redis, Pacing(pinned=60), cost=(runs, 60_000)).admit(2_000, 60)).jobs
    assert len(granted) == 60, len(granted)


async def test_the_look_for_lost_fronts_keeps_a_placed_fronts_entry(redis: Redis) -> None:
    # A backlogged key's front in its line carries what a pass plans its key by (its estimate, how many wait behind
    # it and which): the look for fronts in no line, every DRIFT_CHECK_MS, must leave it as it is.
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    for n in range(1, 21):
        await _create(store, n, "team-a")
    admission = AdmissionStore(redis, Pacing(pinned=60), cost=(TIME, 60_000))
    assert (await admission.admit(0, 1)).jobs == [_job(1)]
    before = await redis.hget(keys.fronts(keys.partition_of(_job(2))), _job(2))
    assert before is not None
    await _create(store, 0, "team-b")
    await admission.admit(20_000, 1)  # a full read with the look for lost fronts
    assert await redis.hget(keys.fronts(keys.partition_of(_job(2))), _job(2)) == before
