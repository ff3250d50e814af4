"""A poll that backs off from a server that does not answer goes again as soon as another call to that server
gets an answer (a restarted Hermes is polled at once, not at the end of RUNS_BACKOFF...RUNS_BACKOFF_MAX)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from broker.simulator.state import Simulator
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled


async def test_polls_backing_off_from_a_down_hermes_go_at_once_when_it_answers_again(
    make_replica: ClientFactory, sim: Simulator, caplog: pytest.LogCaptureFixture
) -> None:
    # Given backoffs far longer than the test (the first wait after a failed poll is 10-20 s), and two runs
    replica = await make_replica(runs_backoff_ms=20_000, runs_backoff_max_ms=60_000)
    ids = [(await create(replica, {"input": f"slow {n} sleep:30"}))["run_id"] for n in range(2)]
    for job_id in ids:
        await eventually(lambda job_id=job_id: _status_is(replica, job_id, "running"))
    # When Hermes restarts (its runs gone, its connections dropped for a second): both polls fail and back off
    await sim.restart(cancel=False, down_s=1.0)
    await eventually(lambda: _backing_off(caplog, ids), timeout=10)
    # and once it is back, another call gets an answer (a new job's create)
    await eventually(lambda: _after(sim.refuse_until))
    answered = await create(replica, {"input": "hello"})
    assert (await settled(replica, answered["run_id"], timeout=10))["status"] == "completed"
    # Then both interrupted runs are resubmitted well before their backoff would have ended
    started = time.monotonic()
    for job_id in ids:
        await eventually(lambda job_id=job_id: _resubmitted(replica, job_id), timeout=8)
    assert time.monotonic() - started < 8
    for job_id in ids:  # (their second runs would take 30 s)
        await replica.post(f"/v1/runs/{job_id}/stop")
        assert (await settled(replica, job_id, timeout=10))["status"] == "cancelled"


async def _status_is(replica: TestClient[Any, Any], job_id: str, status: str) -> bool:
    return (await job(replica, job_id))["status"] == status


async def _backing_off(caplog: pytest.LogCaptureFixture, ids: list[str]) -> bool:
    """Every run's poll failed once (one warn line per job and failure streak)."""
    warned = {getattr(r, "job", None) for r in caplog.records if r.message.startswith("Could not reach Hermes to poll")}
    return warned >= set(ids)


async def _after(moment: float) -> bool:
    return time.monotonic() > moment


async def _resubmitted(replica: TestClient[Any, Any], job_id: str) -> bool:
    return (await job(replica, job_id))["attempts"] >= 2
