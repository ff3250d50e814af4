"""A runner whose write fails on Redis (a lost connection, the batch's own retry spent) against the simulator over
real HTTP and real Redis: what it hands back must still be its own, and a run Hermes accepted for the write that
failed is not left beside the job's next one (SPEC S4 "One job, one thread, one Hermes run at a time")."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.test_utils import TestClient
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from broker.app import supervisor_key, writer_key
from broker.events import RunAccepted
from broker.simulator.state import Simulator
from broker.store import keys
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled

Fault = Callable[[str], Awaitable[None]]


def _on_the_write_that_records_a_run(replica: TestClient[Any, Any], fault: Fault) -> list[str]:
    """The replica's first write that records a run Hermes accepted fails with a lost connection, before it ran in
    Redis, after `fault(job_id)`; the list gets the run's id."""
    store = replica.app[writer_key].store  # type: ignore[index]
    append, failed = store.append, []

    async def wrapped(*args: Any, **fields: Any) -> Any:
        accepted = [event for event in args[1] if isinstance(event, RunAccepted)]  # (job_id, events, view)
        if accepted and not failed:
            failed.append(accepted[0].hermes_run_id)
            await fault(args[0])
            raise RedisConnectionError("Connection closed by server.")
        return await append(*args, **fields)

    store.append = wrapped
    return failed


def _now(probe: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
    async def probed() -> Any:
        return probe()

    return probed


async def _live(replica: TestClient[Any, Any]) -> int:
    return int((await (await replica.get("/readyz")).json())["admission"]["live"])


async def test_a_runner_whose_write_fails_after_its_job_was_taken_over_leaves_the_new_owners_slot(
    make_replica: ClientFactory, redis: Redis
) -> None:
    # Given a replica frozen while it records the run Hermes accepted for a job: meanwhile the job's lease expired
    # and another replica took the job over with its admission slot; the write then fails with a lost connection
    replica = await make_replica()

    async def taken_over(job_id: str) -> None:
        await redis.set(keys.lease(job_id), "replica-b:token", px=60_000)

    failed = _on_the_write_that_records_a_run(replica, taken_over)
    # When the runner ends
    job_id = (await create(replica, {"input": "long sleep:30"}))["run_id"]
    await eventually(_now(lambda: failed))
    supervisor = replica.app[supervisor_key]  # type: ignore[index]
    await eventually(_now(lambda: job_id not in supervisor._runners), timeout=5)
    # Then the slot stays the new owner's: not put back in the line, not released, for another job to take
    assert await _live(replica) == 1
    assert await redis.hexists(keys.FIRST_ADMISSION.slots, job_id)
    assert await redis.zscore(keys.line(keys.partition_of(job_id)), job_id) is None
    assert (await job(replica, job_id))["status"] == "queued"
    assert await redis.get(keys.lease(job_id)) == "replica-b:token"


async def test_a_run_accepted_by_hermes_whose_record_failed_is_stopped_once_the_job_runs_again(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given a replica whose write that records the run Hermes accepted fails with a lost connection (Redis did not
    # run it): the job is retried, and Hermes 0.19 (which ignores the create's key) starts a second run
    replica = await make_replica()

    async def nothing(job_id: str) -> None:
        return None

    failed = _on_the_write_that_records_a_run(replica, nothing)
    job_id = (await create(replica, {"input": "long sleep:4"}))["run_id"]
    # When the job runs again and its second run is recorded
    await eventually(_now(lambda: failed))
    first = failed[0]

    async def followed_again() -> bool:
        return (await job(replica, job_id)).get("hermes_run_id") not in (None, first)

    await eventually(followed_again, timeout=10)
    # Then the first run, which nothing follows, is stopped rather than left to run beside it
    await eventually(_now(lambda: sim.runs[first].stopping), timeout=3)
    assert (await settled(replica, job_id, timeout=20))["status"] == "completed"
