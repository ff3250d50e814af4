"""Driver fixtures: the Hermes simulator in-process over real HTTP, broker replicas that drive jobs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from broker.simulator.app import create_app as create_simulator
from broker.simulator.control import simulator_key
from broker.simulator.state import Settings, Simulator
from tests.integration.conftest import ClientFactory

FAST = {
    "runs_poll_interval_ms": 200,
    "runs_backoff_ms": 50,
    "runs_backoff_max_ms": 200,
    "runs_lease_ms": 1_500,
}


@pytest.fixture
async def hermes_server(aiohttp_server: Any) -> TestServer:
    server: TestServer = await aiohttp_server(create_simulator(Settings(step_s=0.01, events_wait_s=0.2)))
    return server


@pytest.fixture
def sim(hermes_server: TestServer) -> Simulator:
    return hermes_server.app[simulator_key]  # type: ignore[index]


@pytest.fixture
def make_replica(make_client: ClientFactory, hermes_server: TestServer) -> ClientFactory:
    """A broker replica that drives jobs against the simulator, with fast timings."""

    async def make(**overrides: Any) -> TestClient[Any, Any]:
        settings = {**FAST, "hermes_url": str(hermes_server.make_url("")).rstrip("/"), **overrides}
        return await make_client(drive=True, **settings)

    return make


async def eventually(probe: Callable[[], Awaitable[Any]], *, timeout: float = 15.0) -> Any:
    """Poll `probe` until it returns something truthy; fail with its last value at the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(0.02)
    raise AssertionError(f"condition not met within {timeout}s; last value: {last!r}")


async def job(client: TestClient[Any, Any], job_id: str) -> dict[str, Any]:
    response = await client.get(f"/v1/runs/{job_id}")
    assert response.status == 200
    body: dict[str, Any] = await response.json()
    return body


async def create(client: TestClient[Any, Any], body: dict[str, Any], **headers: str) -> dict[str, Any]:
    response = await client.post("/v1/runs", json=body, headers=headers)
    assert response.status == 202, await response.text()
    created: dict[str, Any] = await response.json()
    return created


async def settled(client: TestClient[Any, Any], job_id: str, *, timeout: float = 15.0) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        current = await job(client, job_id)
        return current if current["status"] in ("completed", "failed", "cancelled") else None

    result: dict[str, Any] = await eventually(probe, timeout=timeout)
    return result
