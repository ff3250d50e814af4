"""A replica that loses a job while Hermes creates its run (SPEC S4 "One job, one thread, one Hermes run at a time"):
a run Hermes accepted for it is stopped once the job has another, and a refusal answered to it leaves the job's
slot and place to its owner (broker/driver/forsaken.py, Runner._submit)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from broker.app import supervisor_key
from broker.simulator.state import Simulator
from broker.store import keys
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually

#: Hermes answers the first create this late (its run is created at once; the answer waits).
LATE_S = 1.5


def create_answered(sim: Simulator) -> bool:
    first = next(entry for entry in sim.requests if entry["method"] == "POST" and entry["path"] == "/v1/runs")
    return first["status"] is not None


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
