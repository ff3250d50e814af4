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


def create_answered(sim: Simulator) -> bool:
    first = next(entry for entry in sim.requests if entry["method"] == "POST" and entry["path"] == "/v1/runs")
    return first["status"] is not None


async def test_a_run_accepted_while_its_answer_is_recorded_when_a_drain_cancels_the_runner_is_stopped(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given a Hermes that ignores the Idempotency-Key (0.19), slow to answer a replica's create of a job's run, and
    # Redis writes paused when it answers (a slow write: REDIS_WAIT_REPLICAS, a failover), so the replica's record
    # of the accepted run is on its way
    sim.settings.delay_s = LATE_S
    draining = await make_replica(runs_lease_ms=10_000)  # no renewal is due while writes wait
    job_id = (await create(draining, {"input": "drained sleep:10"}))["run_id"]
    await eventually(lambda: _async([e for e in sim.requests if e["path"] == "/v1/runs"]))
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
    # and another replica takes the job and runs it (Hermes makes a second run: it ignores the key)
    survivor = await make_replica()

    async def running() -> dict[str, Any] | None:
        current = await job(survivor, job_id)
        return current if current["status"] == "running" else None

    followed = (await eventually(running))["hermes_run_id"]
    # Then the run Hermes accepted for the drained replica is stopped: the job keeps one run, the one it follows
    forsaken = next(entry["run_id"] for entry in sim.requests if entry["path"] == "/v1/runs")
    assert forsaken != followed
    await eventually(lambda: _async(sim.active_count() == 1))
    assert sim.runs[str(forsaken)].status == "cancelled"
    assert sim.runs[followed].task is not None and not sim.runs[followed].task.done()
    assert (await survivor.post(f"/v1/runs/{job_id}/stop")).status == 200  # done: not followed to its end
    await settled(survivor, job_id)


async def test_a_refusal_answered_after_the_job_was_taken_over_leaves_its_slot_and_line_alone(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given a replica whose create of a job's run is on its way to a slow Hermes, with a long run lease (its renewal
    # does not come before Hermes answers)
    sim.settings.delay_s = LATE_S
    replica = await make_replica(runs_lease_ms=60_000)
    job_id = (await create(replica, {"input": "taken sleep:30"}))["run_id"]
    await eventually(lambda: _async([e for e in sim.requests if e["path"] == "/v1/runs"]))
    sim.settings.delay_s = 0
    slots, line = keys.FIRST_ADMISSION.slots, keys.line(keys.partition_of(job_id))
    place = await redis.hget(slots, job_id)
    assert place is not None
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


async def _async(value: Any) -> Any:
    return value
