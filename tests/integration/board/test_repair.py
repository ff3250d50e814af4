"""Active-run repair during reconciliation (SPEC S5.6): jobs whose driver missed the end of their Hermes run."""

from __future__ import annotations

import logging
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio import Redis

from broker.app import writer_key
from broker.events import JobFinished, RunAccepted
from broker.hermes.models import Accepted, HermesRun
from broker.http.appkeys import clock_key, hermes_key, store_key
from broker.store import keys
from tests.conftest import BOTH_BACKENDS
from tests.integration.board.conftest import Receiver, deliveries, until_true
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job

pytestmark = BOTH_BACKENDS

LOG = logging.getLogger("tests.board.repair")


async def undriven(make_client: ClientFactory, receiver: Receiver, hermes_server: TestServer) -> TestClient[Any, Any]:
    """A replica that reports and reconciles every second but drives nothing (no driver will see the run end)."""
    return await make_client(
        drive=False,
        board_enabled=True,
        board_url=receiver.url,
        board_reconcile_interval_ms=1_000,
        hermes_url=str(hermes_server.make_url("")).rstrip("/"),
    )


async def accept_without_driver(replica: TestClient[Any, Any], job_id: str, hermes_run_id: str) -> None:
    """Record that Hermes accepted the job's first attempt, as a driver would have, then drive nothing."""
    writer = replica.app[writer_key]
    now = replica.app[clock_key].now_ms()
    accepted = RunAccepted(job_id=job_id, at_ms=now, attempt=1, hermes_run_id=hermes_run_id)
    await writer.commit(job_id, await writer.load(job_id), lambda view: [accepted], log=LOG)


async def start_run(replica: TestClient[Any, Any], job_id: str) -> str:
    """Create the Hermes run directly on the simulator and wait until it completed."""
    hermes = replica.app[hermes_key]
    outcome = await hermes.create(b'{"input": "hello tools:1"}', idempotency_key=job_id)
    assert isinstance(outcome, Accepted)

    async def completed() -> bool:
        run = await hermes.get(outcome.run_id)
        return isinstance(run, HermesRun) and run.status == "completed"

    await eventually(completed)
    return outcome.run_id


async def test_repair_completes_a_job_whose_driver_missed_the_end(
    make_client: ClientFactory, receiver: Receiver, hermes_server: TestServer
) -> None:
    # Given a job accepted by Hermes whose run completed while no driver followed it
    replica = await undriven(make_client, receiver, hermes_server)
    job_id = (await create(replica, {"input": "hello tools:1"}))["run_id"]
    run_id = await start_run(replica, job_id)
    await accept_without_driver(replica, job_id, run_id)
    running = await receiver.running_with_run(job_id)
    # When reconciliation runs
    reports = await receiver.until(job_id, "done")
    # Then the board is done with the known source time (never Hermes's updated_at, never now)
    done = reports[-1]
    assert done["runId"] == run_id and done["at"] > running["at"]
    assert done["sourceActivityAt"] == running["sourceActivityAt"]
    view = await job(replica, job_id)
    assert view["status"] == "completed" and view["output"]
    history = await replica.app[store_key].read(job_id)
    finished = [event for _, event in history if isinstance(event, JobFinished)]
    assert len(finished) == 1 and finished[0].source_at_ms == running["sourceActivityAt"]


async def test_a_stop_wins_over_the_status_hermes_reports(
    make_client: ClientFactory, receiver: Receiver, hermes_server: TestServer
) -> None:
    # Given an accepted job that was asked to stop, whose run then completed unobserved
    replica = await undriven(make_client, receiver, hermes_server)
    job_id = (await create(replica, {"input": "hello tools:1"}))["run_id"]
    run_id = await start_run(replica, job_id)
    await accept_without_driver(replica, job_id, run_id)
    assert (await replica.post(f"/v1/runs/{job_id}/stop")).status == 200
    # When reconciliation repairs it
    reports = await receiver.until(job_id, "stopped")
    # Then the stop wins: stopped, cancelled, never done
    assert all(report["state"] != "done" for report in reports)
    assert (await job(replica, job_id))["status"] == "cancelled"


async def test_a_lost_run_stays_running_and_goes_back_to_the_drivers(
    make_client: ClientFactory, receiver: Receiver, hermes_server: TestServer, redis: Redis, backend: str
) -> None:
    # Given an accepted job whose Hermes run no longer exists (404)
    replica = await undriven(make_client, receiver, hermes_server)
    job_id = (await create(replica, {"input": "hello"}))["run_id"]
    await accept_without_driver(replica, job_id, "run_forgotten_by_a_restart")
    await receiver.running_with_run(job_id)

    # When reconciliation repairs it
    async def resubmitted() -> dict[str, Any] | None:
        view = await job(replica, job_id)
        return view if view["last_event"] == "job.resubmitted" else None

    view = await eventually(resubmitted)
    # Then it stays running for its next attempt, and the drivers were rung (beside the create's line doorbell, rung
    # on a cluster only: on a single Redis the `line J` its write published rang the passes)
    assert view["status"] == "running"
    assert all(report["state"] == "running" for report in receiver.reports(job_id))
    doorbells = await redis.xrange(keys.WORK)
    assert [fields.get("job") for _, fields in doorbells].count(job_id) == 1
    assert [fields.get("line") for _, fields in doorbells].count(job_id) == (1 if backend == "cluster" else 0)


async def test_a_job_a_replica_drives_is_not_repaired(
    make_client: ClientFactory, receiver: Receiver, hermes_server: TestServer, redis: Redis
) -> None:
    # Given a completed run whose job is leased by a (slow) driver
    replica = await undriven(make_client, receiver, hermes_server)
    job_id = (await create(replica, {"input": "hello"}))["run_id"]
    run_id = await start_run(replica, job_id)
    await redis.set(keys.lease(job_id), "another-replica", px=60_000)
    await accept_without_driver(replica, job_id, run_id)
    await receiver.running_with_run(job_id)
    # When reconciliation passes (it replays the acknowledged running version)
    await until_true(lambda: deliveries(replica, "replayed") >= 1)
    # Then the job is left to its driver
    assert (await job(replica, job_id))["status"] == "running"
    assert all(report["state"] == "running" for report in receiver.reports(job_id))
