"""A replica that loses a job while Hermes creates its run (SPEC S4 "One job, one thread, one Hermes run at a time"):
a run Hermes accepted for it is stopped once the job has another, and a refusal answered to it leaves the job's
slot and place to its owner (broker/driver/forsaken.py, Runner._submit)."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis

from broker.app import supervisor_key
from broker.simulator.state import Simulator
from broker.store import keys
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled

#: Hermes answers the first create this late (its run is created at once; the answer waits).
LATE_S = 1.5


def creates(sim: Simulator) -> list[dict[str, Any]]:
    """The creates Hermes got."""
    return [entry for entry in sim.requests if entry["method"] == "POST" and entry["path"] == "/v1/runs"]


def create_answered(sim: Simulator) -> bool:
    first = next(entry for entry in sim.requests if entry["method"] == "POST" and entry["path"] == "/v1/runs")
    return first["status"] is not None


async def test_a_drain_waits_for_hermes_to_answer_a_create_and_the_next_owner_follows_that_run(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given a Hermes that ignores the Idempotency-Key (0.19), slow to answer a replica's create of a job's run
    sim.settings.delay_s = LATE_S
    draining = await make_replica()
    job_id = (await create(draining, {"input": "drained sleep:10"}))["run_id"]
    await eventually(lambda: _async(creates(sim)))
    sim.settings.delay_s = 0
    # When the replica drains (SIGTERM) while the create is on its way
    assert await draining.app[supervisor_key].drain() == 1  # type: ignore[index]
    # Then it hands the job back with Hermes's run recorded, and the next owner follows that run: one run in all
    first = creates(sim)[0]["run_id"]
    assert (await job(draining, job_id))["hermes_run_id"] == first
    survivor = await make_replica()
    await eventually(lambda: _async(survivor.app[supervisor_key].active == 1))  # type: ignore[index]
    assert (await job(survivor, job_id))["status"] == "running"
    assert len(creates(sim)) == 1 and sim.active_count() == 1
    assert (await survivor.post(f"/v1/runs/{job_id}/stop")).status == 200
    await settled(survivor, job_id)
    assert len(creates(sim)) == 1


async def test_a_run_accepted_while_its_answer_is_recorded_when_a_drain_cancels_the_runner_is_recorded_by_the_drain(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given a Hermes that ignores the Idempotency-Key (0.19), slow to answer a replica's create of a job's run, and
    # Redis writes paused when it answers (a slow write: REDIS_WAIT_REPLICAS, a failover), so the replica's record
    # of the accepted run is on its way
    sim.settings.delay_s = LATE_S
    draining = await make_replica(runs_lease_ms=10_000)  # no renewal is due while writes wait
    job_id = (await create(draining, {"input": "drained sleep:10"}))["run_id"]
    await eventually(lambda: _async(creates(sim)))
    sim.settings.delay_s = 0
    await redis.execute_command("CLIENT", "PAUSE", 10_000, "WRITE")
    try:
        await eventually(lambda: _async(create_answered(sim)))
        await asyncio.sleep(0.3)  # the runner reads the answer and sends its write
        # When the replica drains then (SIGTERM), cancelling its runner while the write waits
        drain = asyncio.create_task(draining.app[supervisor_key].drain())  # type: ignore[index]
        await asyncio.sleep(0.3)
    finally:
        await redis.execute_command("CLIENT", "UNPAUSE")
    assert await drain == 1
    # Then the drain records the run Hermes accepted before it hands the job back, and another replica follows it:
    # the job keeps one run
    survivor = await make_replica()

    async def running() -> dict[str, Any] | None:
        current = await job(survivor, job_id)
        return current if current["status"] == "running" else None

    followed = (await eventually(running))["hermes_run_id"]
    assert followed == creates(sim)[0]["run_id"]
    await eventually(lambda: _async(survivor.app[supervisor_key].active == 1))  # type: ignore[index]
    assert len(creates(sim)) == 1 and sim.active_count() == 1
    assert (await survivor.post(f"/v1/runs/{job_id}/stop")).status == 200  # done: not followed to its end
    await settled(survivor, job_id)


async def test_a_refusal_answered_after_the_job_was_taken_over_leaves_its_slot_and_line_alone(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given a replica whose create of a job's run is on its way to a slow Hermes (a long lease: no renewal meanwhile)
    replica, job_id, place = await taken_on_its_way(make_replica, sim, redis)
    slots, line = keys.FIRST_ADMISSION.slots, keys.line(keys.partition_of(job_id))
    # When the job is taken over meanwhile (its lease is another replica's, which holds its slot), and Hermes then
    # answers the first replica 429
    await redis.set(keys.lease(job_id), "another-replica/token", px=60_000)
    sim.settings.busy = True
    await eventually(lambda: _async(create_answered(sim)))
    supervisor = replica.app[supervisor_key]  # type: ignore[index]
    await eventually(lambda: _async(supervisor.active == 0))
    # Then the first replica lets the job go without touching the new owner's slot, the line or the refusal state
    assert await redis.hget(slots, job_id) == place
    assert await redis.zscore(line, job_id) is None
    assert not await redis.hget(keys.FIRST_ADMISSION.state, "refusing")


async def taken_on_its_way(make_replica: ClientFactory, sim: Simulator, redis: Redis) -> tuple[Any, str, str]:
    """A replica whose create of a job's run is on its way to a slow Hermes, with a long run lease (its renewal does
    not come before Hermes answers): (the replica, the job, its admission slot's place)."""
    sim.settings.delay_s = LATE_S
    replica = await make_replica(runs_lease_ms=60_000)
    job_id = str((await create(replica, {"input": "taken sleep:30"}))["run_id"])
    await eventually(lambda: _async(creates(sim)))
    sim.settings.delay_s = 0
    place = await redis.hget(keys.FIRST_ADMISSION.slots, job_id)
    assert place is not None
    return replica, job_id, place


async def _async(value: Any) -> Any:
    return value


async def test_a_drain_hands_the_jobs_it_follows_back_at_once_while_it_waits_for_a_create_answer(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given a replica following one job's Hermes run, with a long run lease (no expiry hands it over by itself), and a
    # create of another job's run on its way to a slow Hermes
    draining = await make_replica(runs_lease_ms=30_000)
    followed = (await create(draining, {"input": "followed sleep:30"}))["run_id"]

    async def following() -> bool:
        return bool((await job(draining, followed))["hermes_run_id"])

    await eventually(following)
    sim.settings.delay_s = 3.0
    await create(draining, {"input": "drained sleep:30"})
    await eventually(lambda: _async(len(creates(sim)) == 2))
    sim.settings.delay_s = 0
    # When the replica drains (SIGTERM) while that create is on its way
    drain = asyncio.create_task(draining.app[supervisor_key].drain())  # type: ignore[index]
    # Then the job it follows is handed back at once (SPEC S4 "Drain": no lease wait), not after Hermes's answer to
    # the other job's create
    await eventually(lambda: _async_not(redis.exists(keys.lease(followed))), timeout=1.0)
    assert creates(sim)[1]["status"] is None  # the other create is still on its way
    assert await drain == 2


async def _async_not(value: Any) -> bool:
    return not await value


async def test_a_create_a_drain_waits_for_keeps_its_admission_slot_so_no_other_create_goes_past_the_limit(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given Hermes limited to one live run of the broker's, a replica whose create of a job's run is on its way to a
    # slow Hermes (longer than its slot's RUNS_LEASE), and another job waiting in line behind it
    draining = await make_replica(hermes_max_concurrent=(1,))
    sim.settings.delay_s = 5.0
    first = (await create(draining, {"input": "drained sleep:30"}))["run_id"]
    await eventually(lambda: _async(creates(sim)))
    sim.settings.delay_s = 0
    second = (await create(draining, {"input": "waiting sleep:30"}))["run_id"]
    other = await make_replica(hermes_max_concurrent=(1,))
    # When the first replica drains (SIGTERM) while the create is on its way
    drain = asyncio.create_task(draining.app[supervisor_key].drain())  # type: ignore[index]
    # Then no other create goes to Hermes while the drain waits for its answer: its slot is still taken
    while not create_answered(sim):
        assert len(creates(sim)) == 1, "a second create went while the first was on its way"
        await asyncio.sleep(0.05)
    assert await drain == 1
    assert (await job(other, first))["hermes_run_id"] == creates(sim)[0]["run_id"]
    assert len(creates(sim)) == 1
    assert (await other.post(f"/v1/runs/{first}/stop")).status == 200
    assert (await other.post(f"/v1/runs/{second}/stop")).status == 200
    await settled(other, first)


async def test_a_job_taken_over_while_a_drain_waits_for_its_create_keeps_its_slot_and_stays_out_of_the_line(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given a replica whose create of a job's run is on its way to a slow Hermes (a long lease: no renewal meanwhile)
    replica, job_id, place = await taken_on_its_way(make_replica, sim, redis)
    slots, line = keys.FIRST_ADMISSION.slots, keys.line(keys.partition_of(job_id))
    # When the replica drains (SIGTERM), and the job is taken over while the drain waits for Hermes's answer (its
    # lease is another replica's, which holds its slot)
    drain = asyncio.create_task(replica.app[supervisor_key].drain())  # type: ignore[index]
    await asyncio.sleep(0.3)
    await redis.set(keys.lease(job_id), "another-replica/token", px=60_000)
    assert await drain == 0
    # Then the drain leaves the new owner's slot alone and does not put the job back in line
    assert await redis.hget(slots, job_id) == place
    assert await redis.zscore(line, job_id) is None


async def test_a_job_stopped_while_a_drain_waits_for_its_create_has_the_run_stopped_before_the_drain_ends(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given a replica whose create of a job's run is on its way to a slow Hermes, which also takes a while to answer a
    # stop, and another replica
    sim.settings.delay_s = LATE_S
    draining = await make_replica()
    job_id = (await create(draining, {"input": "stopped sleep:30"}))["run_id"]
    await eventually(lambda: _async(creates(sim)))
    sim.settings.delay_s = 0.5
    other = await make_replica()
    # When the replica drains (SIGTERM), and the job is stopped through the other replica while the drain waits
    drain = asyncio.create_task(draining.app[supervisor_key].drain())  # type: ignore[index]
    assert (await other.post(f"/v1/runs/{job_id}/stop")).status == 200
    assert (await job(other, job_id))["status"] == "cancelled"
    await drain
    # Then, by the time the drain is over (the process exits next), the run Hermes created for it is stopped, or
    # left to the prober as an orphan: no run of the stopped job is left live and forgotten
    run_id = creates(sim)[0]["run_id"]
    stops = [e for e in sim.requests if e["method"] == "POST" and e["path"] == f"/v1/runs/{run_id}/stop"]
    orphaned = await redis.zscore(keys.FIRST_ADMISSION.orphans, run_id)
    assert any(e["status"] is not None for e in stops) or orphaned is not None
    # and its admission slot is free, the job out of the line
    assert await redis.zscore(keys.FIRST_ADMISSION.live, job_id) is None
    assert await redis.zscore(keys.line(keys.partition_of(job_id)), job_id) is None


async def test_a_drain_hands_each_job_back_once_its_own_create_is_answered(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given a replica with two creates on their way to Hermes, one answered late, the other soon, and a long run lease
    # (no expiry hands a job over by itself)
    draining = await make_replica(runs_lease_ms=30_000)
    sim.settings.delay_s = 4.0
    await create(draining, {"input": "late sleep:30"})
    await eventually(lambda: _async(len(creates(sim)) == 1))
    sim.settings.delay_s = 0.5
    soon = (await create(draining, {"input": "soon sleep:30"}))["run_id"]
    await eventually(lambda: _async(len(creates(sim)) == 2))
    sim.settings.delay_s = 0
    # When the replica drains (SIGTERM) while both are on their way
    drain = asyncio.create_task(draining.app[supervisor_key].drain())  # type: ignore[index]
    # Then the job whose create is answered soon is handed back with its run then, not after the other's answer
    await eventually(lambda: _async_not(redis.exists(keys.lease(soon))), timeout=3.0)
    assert creates(sim)[0]["status"] is None  # the late create is still on its way
    assert (await job(draining, soon))["hermes_run_id"] == creates(sim)[1]["run_id"]
    assert await drain == 2


async def test_a_drain_stopping_the_run_of_a_job_stopped_meanwhile_keeps_within_its_budget(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given a replica with a 4 s SHUTDOWN_GRACE (a drain waits 2 s for Hermes) whose create of a job's run is on its
    # way to a slow Hermes, which then answers no stop (it hangs past a 5 s HERMES_TIMEOUT), and another replica
    sim.settings.delay_s = LATE_S
    draining = await make_replica(shutdown_grace_ms=4_000, hermes_timeout_ms=5_000)
    job_id = (await create(draining, {"input": "stopped sleep:30"}))["run_id"]
    await eventually(lambda: _async(creates(sim)))
    sim.settings.delay_s = 60.0
    other = await make_replica(hermes_timeout_ms=5_000)
    # When the replica drains (SIGTERM), and the job is stopped through the other replica while the drain waits
    drain = asyncio.create_task(draining.app[supervisor_key].drain())  # type: ignore[index]
    assert (await other.post(f"/v1/runs/{job_id}/stop")).status == 200
    # Then the drain is over within its budget (not after HERMES_TIMEOUT), leaving the run to the prober as an orphan
    try:
        await asyncio.wait_for(drain, 3.0)
        run_id = creates(sim)[0]["run_id"]
        assert await redis.zscore(keys.FIRST_ADMISSION.orphans, run_id) is not None
    finally:
        sim.settings.delay_s = 0


async def test_a_create_a_drain_waits_for_that_hermes_refuses_tells_the_line_hermes_is_busy(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given a busy Hermes, slow to answer a replica's create of a job's run with its 429
    sim.settings.busy, sim.settings.delay_s = True, LATE_S
    draining = await make_replica()
    job_id = (await create(draining, {"input": "refused sleep:1"}))["run_id"]
    await eventually(lambda: _async(creates(sim)))
    # When the replica drains (SIGTERM) while the create is on its way, and Hermes answers it 429
    assert await draining.app[supervisor_key].drain() == 1  # type: ignore[index]
    assert creates(sim)[0]["status"] == 429
    # Then the line knows Hermes refuses (no replica sends the next create before its Retry-After), and the job is
    # back at its place in it, its slot given back
    admission = (await (await draining.get("/readyz")).json())["admission"]
    assert admission["refusing"] is True and admission["reason"] == "busy"
    assert admission["live"] == 0 and admission["line"] == 1
    assert await redis.zscore(keys.line(keys.partition_of(job_id)), job_id) is not None
