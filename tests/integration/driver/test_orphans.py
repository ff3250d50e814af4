"""Orphaned runs (SPEC S10 "When a lost upstream answers again, a run of an attempt that was already
resubmitted elsewhere is stopped there, so no orphan keeps running"): a crash between the two writes of
`Runner._upstream_lost` (the job's RunInterrupted + RunResubmitted, then the upstream's orphan record)."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from broker.simulator.state import Simulator
from broker.store.upstream_health import HealthStore
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, settled
from tests.integration.driver.test_upstreams import _running, both, name_of, second_hermes, sim_of, url_of

pytestmark = BOTH_BACKENDS
__all__ = ["second_hermes"]  # the fixture, used here


CRASH = pytest.param(
    True,
    id="crash",
)


@pytest.mark.parametrize("crash", [CRASH, pytest.param(False, id="no-crash")])
async def test_a_crash_between_the_resubmit_and_the_orphan_record_still_stops_the_orphan(
    crash: bool,
    make_replica: ClientFactory,
    hermes_server: TestServer,
    second_hermes: TestServer,
    sim: Simulator,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a job running on the second upstream (the first full with a short blocker), lost after 1.5 s of silence
    replica = await make_replica(
        hermes_url=both(hermes_server, second_hermes), hermes_max_concurrent=(1, 4), hermes_upstream_lost_ms=1_500
    )
    first = name_of(hermes_server)
    blocker = await create(replica, {"input": "block sleep:0.5"})
    await eventually(lambda: _running(replica, blocker["run_id"]))
    created = await create(replica, {"input": "long sleep:8"})
    running = await eventually(lambda: _running(replica, created["run_id"]))
    assert running["upstream"] != first
    old_run = running["hermes_run_id"]
    # and the replica that finds its upstream lost dies right after committing the resubmit, before it records the
    # orphan (the write that would have recorded it never happens)
    record = HealthStore.orphan
    crashed: list[str] = [] if crash else ["(no crash: the control case)"]

    async def crash_once(self: HealthStore, upstream: str | None, run_id: str, now_ms: int) -> None:
        if not crashed:
            crashed.append(run_id)
            raise ConnectionError("the replica died here")
        await record(self, upstream, run_id, now_ms)

    monkeypatch.setattr(HealthStore, "orphan", crash_once)
    # When the second upstream goes silent past the lost window, the job moves to the first and completes there
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url_of(second_hermes)}/_sim/refuse", json={"seconds": 120}) as answer:
            assert answer.status == 200
    done = await settled(replica, created["run_id"], timeout=60)
    assert done["attempts"] == 2 and done["upstream"] == first and (crashed == [old_run] or not crash)
    # and the second upstream answers again, still holding the first attempt's run
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url_of(second_hermes)}/_sim/refuse", json={"seconds": 0}) as answer:
            assert answer.status == 200
    # Then that run is stopped there all the same
    stop_path = f"/v1/runs/{old_run}/stop"
    deadline = time.monotonic() + 15
    stopped: list[Any] = []
    while time.monotonic() < deadline and not stopped:
        stopped = [r for r in sim_of(second_hermes).requests if r["path"] == stop_path]
        await __import__("asyncio").sleep(0.2)
    assert stopped, "the first attempt's run was never stopped on its returning upstream"


async def test_a_stopped_job_whose_upstream_is_lost_ends_cancelled(
    make_replica: ClientFactory, hermes_server: TestServer, second_hermes: TestServer, sim: Simulator
) -> None:
    # Given a job running on the second upstream (the first full with a short blocker), lost after 1.5 s of silence
    replica = await make_replica(
        hermes_url=both(hermes_server, second_hermes), hermes_max_concurrent=(1, 4), hermes_upstream_lost_ms=1_500
    )
    first = name_of(hermes_server)
    blocker = await create(replica, {"input": "block sleep:0.5"})
    await eventually(lambda: _running(replica, blocker["run_id"]))
    created = await create(replica, {"input": "long sleep:30"})
    running = await eventually(lambda: _running(replica, created["run_id"]))
    assert running["upstream"] != first
    # When the second upstream goes silent for good (decommissioned, or a frozen host) and the job is stopped
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url_of(second_hermes)}/_sim/refuse", json={"seconds": 120}) as answer:
            assert answer.status == 200
    stopped = await replica.post(f"/v1/runs/{created['run_id']}/stop")
    assert stopped.status == 200
    # Then once the upstream is lost the job ends `cancelled` (SPEC S10: its live runs are treated as interrupted;
    # S4: a stop recorded before the resubmit wins; S3.4: a stop always ends the job), its run left as an orphan to
    # be stopped when the upstream answers again; it does not stay `stopping` for as long as the upstream is gone
    deadline = time.monotonic() + 15
    status = None
    while time.monotonic() < deadline and status != "cancelled":
        status = (await (await replica.get(f"/v1/runs/{created['run_id']}")).json())["status"]
        await __import__("asyncio").sleep(0.2)
    assert status == "cancelled"
