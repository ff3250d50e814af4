"""The core driving flows against both Hermes targets (the simulator and the real hermes-agent 0.19.0):
complete, stop, denied approval, and a Hermes restart mid-run (SPEC S4)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.test_utils import TestClient

from tests.contract.harness import Target

TERMINAL = ("completed", "failed", "cancelled")


async def until(probe: Callable[[], Awaitable[dict[str, Any] | None]], timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await probe()
        if last is not None:
            return last
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout}s; last: {last!r}")


def status_in(
    client: TestClient[Any, Any], job_id: str, *wanted: str
) -> Callable[[], Awaitable[dict[str, Any] | None]]:
    async def probe() -> dict[str, Any] | None:
        job: dict[str, Any] = await (await client.get(f"/v1/runs/{job_id}")).json()
        return job if job["status"] in wanted else None

    return probe


async def create(client: TestClient[Any, Any], text: str) -> str:
    answer = await client.post("/v1/runs", json={"input": text})
    assert answer.status == 202
    job_id: str = (await answer.json())["run_id"]
    return job_id


async def test_a_job_completes(broker: TestClient[Any, Any]) -> None:
    job_id = await create(broker, "Say hello.")
    job = await until(status_in(broker, job_id, *TERMINAL), 60)
    assert job["status"] == "completed" and job["output"] and job["usage"] and job["attempts"] == 1


async def test_a_stopped_job_is_cancelled(broker: TestClient[Any, Any]) -> None:
    job_id = await create(broker, "Take your time sleep:6")
    await until(status_in(broker, job_id, "running"), 60)
    stopped = await broker.post(f"/v1/runs/{job_id}/stop")
    assert (await stopped.json())["status"] in ("stopping", "cancelled")
    job = await until(status_in(broker, job_id, *TERMINAL), 60)
    assert job["status"] == "cancelled" and job["error"]["code"] == "stopped"


async def test_a_denied_approval_cancels_the_job(broker: TestClient[Any, Any]) -> None:
    job_id = await create(broker, "Clean up please approval")
    waiting = await until(status_in(broker, job_id, "waiting_for_approval", *TERMINAL), 60)
    assert waiting["status"] == "waiting_for_approval"
    answer = await broker.post(f"/v1/runs/{job_id}/approval", json={"choice": "deny"})
    assert answer.status == 200, await answer.text()
    job = await until(status_in(broker, job_id, *TERMINAL), 60)
    assert job["status"] == "cancelled" and job["error"]["code"] == "approval_denied"
    assert job["error"]["message"]  # the denied command


async def test_a_hermes_restart_resubmits_and_completes(broker: TestClient[Any, Any], hermes: Target) -> None:
    job_id = await create(broker, "Answer slowly sleep:4")
    await until(status_in(broker, job_id, "running"), 60)
    await asyncio.to_thread(hermes.restart)  # the broker keeps serving while Hermes goes down and up
    job = await until(status_in(broker, job_id, *TERMINAL), 120)
    assert job["status"] == "completed" and job["attempts"] == 2
