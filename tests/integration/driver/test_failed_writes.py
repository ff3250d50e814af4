"""A runner whose write fails on Redis (a lost connection, the batch's own retry spent) against the simulator over
real HTTP and real Redis: what it hands back must still be its own, and a run Hermes accepted for the write that
failed is not left beside the job's next one (SPEC S4 "One job, one thread, one Hermes run at a time")."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import ClientSession
from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError, ReadOnlyError

from broker.app import supervisor_key, writer_key
from broker.driver import forsaken
from broker.events import RunAccepted
from broker.simulator.state import Simulator
from broker.store import keys
from broker.store import leases as leases_module
from broker.store.outage import is_outage
from broker.store.scripts import run_many
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled

Append = Callable[..., Awaitable[Any]]
#: what the first write that records a run does instead, given the real write and its arguments: it raises
Fault = Callable[[Append, tuple[Any, ...], dict[str, Any]], Awaitable[None]]


def _on_the_write_that_records_a_run(replica: TestClient[Any, Any], fault: Fault) -> list[str]:
    """The replica's first write that records a run Hermes accepted is `fault` instead; the list gets the run's id."""
    store = replica.app[writer_key].store  # type: ignore[index]
    append, failed = store.append, []

    async def wrapped(*args: Any, **fields: Any) -> Any:
        accepted = [event for event in args[1] if isinstance(event, RunAccepted)]  # (job_id, events, view)
        if accepted and not failed:
            failed.append(accepted[0].hermes_run_id)
            await fault(append, args, fields)
            raise AssertionError("a fault raises")
        return await append(*args, **fields)

    store.append = wrapped
    return failed


def _now(probe: Callable[[], Any]) -> Callable[[], Awaitable[Any]]:
    async def probed() -> Any:
        return probe()

    return probed


async def _live(replica: TestClient[Any, Any]) -> int:
    return int((await (await replica.get("/readyz")).json())["admission"]["live"])


@pytest.mark.parametrize(
    "error",
    [RedisConnectionError("Connection closed by server."), ValueError("a bug")],
    ids=["lost-connection", "a-bug"],
)
async def test_a_runner_whose_write_fails_after_its_job_was_taken_over_leaves_the_new_owners_slot(
    make_replica: ClientFactory, redis: Redis, error: Exception
) -> None:
    # Given a replica frozen while it records the run Hermes accepted for a job: meanwhile the job's lease expired
    # and another replica took the job over with its admission slot; the write then fails: with a lost connection
    # (the record goes again, and the lease's fence refuses it), or with a bug (the runner fails at once, and its
    # hand-back finds the lease gone)
    replica = await make_replica()

    async def taken_over(append: Append, args: tuple[Any, ...], fields: dict[str, Any]) -> None:
        await redis.set(keys.lease(args[0]), "replica-b:token", px=60_000)
        raise error

    failed = _on_the_write_that_records_a_run(replica, taken_over)
    # When the runner ends
    job_id = (await create(replica, {"input": "long sleep:30"}))["run_id"]
    await eventually(_now(lambda: failed))
    supervisor = replica.app[supervisor_key]  # type: ignore[index]
    await eventually(_now(lambda: job_id not in supervisor._runners), timeout=5)
    # Then the slot stays the new owner's: not put back in the line, not released, for another job to take
    assert await _live(replica) == 1
    assert await redis.zscore(keys.FIRST_ADMISSION.live, job_id) is not None
    assert await redis.zscore(keys.line(keys.partition_of(job_id)), job_id) is None
    assert (await job(replica, job_id))["status"] == "queued"
    assert await redis.get(keys.lease(job_id)) == "replica-b:token"


@pytest.mark.parametrize(
    ("error", "ran"),
    [
        (OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), False),
        (RedisConnectionError("Connection closed by server."), True),
    ],
    ids=["full-redis", "reply-lost"],
)
async def test_a_run_whose_record_fails_once_is_recorded_when_redis_answers_again_and_is_the_jobs_only_run(
    make_replica: ClientFactory, sim: Simulator, redis: Redis, error: Exception, ran: bool
) -> None:
    # Given a replica whose write that records the run Hermes accepted fails once, while the job's lease is its own:
    # refused by a full Redis (it did not run), or run with its reply lost (the batch's resend spent)
    replica = await make_replica()
    failed = _on_the_write_that_records_a_run(replica, _fails(error, ran=ran))
    job_id = (await create(replica, {"input": "long sleep:2"}))["run_id"]
    await eventually(_now(lambda: failed))
    run = sim.runs[failed[0]]
    slotless = 0
    while not run.terminal:  # its slot, sampled while the run is live
        slotless += await redis.zscore(keys.FIRST_ADMISSION.live, job_id) is None
        await asyncio.sleep(0.01)
    # Then the job follows that run, holding its slot all along, and no second run is created (Hermes 0.19 ignores
    # the create's Idempotency-Key: a job created again would run twice)
    assert (await settled(replica, job_id, timeout=20))["status"] == "completed"
    assert (await job(replica, job_id))["hermes_run_id"] == failed[0]
    assert list(sim.runs) == failed and not run.stopping
    assert slotless == 0, f"the job held no slot in {slotless} looks while its run was live"


def _fails(error: Exception, *, ran: bool) -> Fault:
    async def fault(append: Append, args: tuple[Any, ...], fields: dict[str, Any]) -> None:
        if ran:
            await append(*args, **fields)
        raise error

    return fault


async def test_the_watch_of_a_forsaken_run_rides_out_a_connection_torn_down_under_it(
    make_replica: ClientFactory, sim: Simulator, hermes_server: TestServer
) -> None:
    # Given a job that ended, a run Hermes made for it that nothing follows (its replica lost the job while the
    # create was on its way), and a connection torn down under the watch's first look at the job (a failover)
    replica = await make_replica()
    job_id = (await create(replica, {"input": "done"}))["run_id"]
    await settled(replica, job_id)
    async with ClientSession() as http:
        async with http.post(hermes_server.make_url("/v1/runs"), json={"input": "forsaken sleep:30"}) as answer:
            run_id = (await answer.json())["run_id"]
    writer = replica.app[writer_key]  # type: ignore[index]
    load, looks = writer.load, []

    async def torn_down_once(job: str) -> Any:
        looks.append(job)
        if len(looks) == 1:
            raise _torn_down()
        return await load(job)

    writer.load = torn_down_once
    # When the replica watches the run
    forsaken.forsake(replica.app[supervisor_key]._deps, job_id, 1, None, run_id)  # type: ignore[index]
    # Then it looks again and stops it
    await eventually(_now(lambda: sim.runs[run_id].stopping), timeout=5)
    assert len(looks) >= 2


def _torn_down() -> AttributeError:
    """The error a write on a peer-closed transport raises inside redis-py's connection (an outage, SPEC S9)."""
    code = compile(
        "raise AttributeError(\"'NoneType' object has no attribute 'writelines'\")", "redis/connection.py", "exec"
    )
    try:
        exec(code)
    except AttributeError as error:
        assert is_outage(error)
        return error
    raise AssertionError("unreachable")


async def test_a_runner_whose_hand_back_fails_after_its_job_ended_lets_the_slot_go_and_forgets_the_lease(
    make_replica: ClientFactory, redis: Redis
) -> None:
    # Given a replica whose job ended by its own write (which released the run lease), and whose hand-back of the
    # job's slot then fails on Redis (a lost connection)
    replica = await make_replica()
    gate = replica.app[supervisor_key]._deps.gate  # type: ignore[index]
    release, refused = gate.release, []

    async def lost_once(*args: Any, **fields: Any) -> None:
        if not refused:
            refused.append(args[0])
            raise RedisConnectionError("Connection closed by server.")
        await release(*args, **fields)

    gate.release = lost_once
    # When the job ends
    job_id = (await create(replica, {"input": "short"}))["run_id"]
    assert (await settled(replica, job_id))["status"] == "completed"
    # Then the runner, finding its lease gone, lets the ended job's slot go, and keeps no note of the lease
    supervisor = replica.app[supervisor_key]  # type: ignore[index]
    await eventually(_now(lambda: job_id not in supervisor._runners and refused), timeout=5)
    await eventually(_now(lambda: not supervisor._leases._ended), timeout=5)

    async def slot_gone() -> bool:
        return await redis.zscore(keys.FIRST_ADMISSION.live, job_id) is None

    await eventually(slot_gone, timeout=5)


def _renewals_fail_while(monkeypatch: pytest.MonkeyPatch, fault: dict[str, Exception | None]) -> None:
    """The replica's lease renewals fail with `fault["error"]` while it is set (Redis takes no writes)."""

    async def renew(*args: Any, **kwargs: Any) -> Any:
        if fault["error"] is not None:
            raise fault["error"]
        return await run_many(*args, **kwargs)

    monkeypatch.setattr(leases_module, "run_many", renew)


def _record_fails_while(replica: TestClient[Any, Any], fault: dict[str, Exception | None]) -> list[str]:
    """Every write that records a run Hermes accepted fails with `fault["error"]` while it is set; the list gets
    the run's id and counts the tries."""
    store = replica.app[writer_key].store  # type: ignore[index]
    append, tries = store.append, []

    async def wrapped(*args: Any, **fields: Any) -> Any:
        accepted = [event for event in args[1] if isinstance(event, RunAccepted)]  # (job_id, events, view)
        if accepted:
            tries.append(accepted[0].hermes_run_id)
            if fault["error"] is not None:
                raise fault["error"]
        return await append(*args, **fields)

    store.append = wrapped
    return tries


async def test_a_run_whose_record_fails_for_longer_than_the_lease_is_still_the_jobs_only_run(
    make_replica: ClientFactory, sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a replica that loses Redis for two and a half leases while it records the run Hermes accepted: the
    # record and the lease renewals fail, and the lease runs out with nobody taking the job
    replica = await make_replica(runs_lease_ms=600)
    fault: dict[str, Exception | None] = {"error": RedisConnectionError("Connection refused.")}
    _renewals_fail_while(monkeypatch, fault)
    tries = _record_fails_while(replica, fault)
    job_id = (await create(replica, {"input": "long sleep:3"}))["run_id"]
    await eventually(_now(lambda: tries))
    await asyncio.sleep(1.5)
    # When Redis takes writes again
    fault["error"] = None
    # Then the run is recorded after several tries, and it is the job's only run: the job is not created again
    assert (await settled(replica, job_id, timeout=20))["status"] == "completed"
    assert len(tries) >= 3, tries
    assert list(sim.runs) == [tries[0]] and not sim.runs[tries[0]].stopping
    assert (await job(replica, job_id))["hermes_run_id"] == tries[0]


async def test_a_run_whose_record_redis_keeps_refusing_is_given_up_once_another_replica_took_the_job(
    make_replica: ClientFactory, redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a replica whose connections stay on a Redis that takes no writes (read-only after a failover): its
    # record of the run Hermes accepted and its lease renewals are refused, and no renewal finds its lease gone
    replica = await make_replica()
    fault: dict[str, Exception | None] = {"error": ReadOnlyError("You can't write against a read only replica.")}
    _renewals_fail_while(monkeypatch, fault)
    tries = _record_fails_while(replica, fault)
    job_id = (await create(replica, {"input": "long sleep:30"}))["run_id"]
    await eventually(_now(lambda: tries))
    # When another replica takes the job over meanwhile
    await redis.set(keys.lease(job_id), "replica-b:token", px=60_000)
    # Then the runner gives the job up while the writes are still refused (it reads who holds the lease)
    supervisor = replica.app[supervisor_key]  # type: ignore[index]
    await eventually(_now(lambda: job_id not in supervisor._runners), timeout=5)
    fault["error"] = None
