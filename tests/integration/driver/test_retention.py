"""Retention from the end (SPEC S3.6): a job that waits or runs never expires; a finished one expires
RUNS_RETENTION after it ended, its idempotency key and its listing entries with it."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.simulator.state import Simulator
from broker.store import keys
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled

pytestmark = BOTH_BACKENDS

RETENTION_MS = 400


async def _status(client: TestClient[Any, Any], job_id: str) -> int:
    return (await client.get(f"/v1/runs/{job_id}")).status


async def _listed(client: TestClient[Any, Any], status: str = "") -> list[str]:
    answer = await client.get("/v1/runs", params={"status": status} if status else {})
    assert answer.status == 200
    return [item["run_id"] for item in (await answer.json())["data"]]


async def _ttls(redis: Redis, job_id: str) -> tuple[int, int]:
    return await redis.pttl(keys.events(job_id)), await redis.pttl(keys.view(job_id))


async def test_a_held_and_a_running_job_outlive_the_retention(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given a tiny retention, a job held by a busy Hermes and a job whose run goes on for a long time
    replica = await make_replica(runs_retention_ms=RETENTION_MS)
    running = (await create(replica, {"input": "long sleep:6"}))["run_id"]

    async def is_running() -> bool:
        return (await job(replica, running))["status"] == "running"

    await eventually(is_running)
    sim.settings.busy = True
    held = (await create(replica, {"input": "waits"}))["run_id"]

    async def is_held() -> bool:
        return (await job(replica, held))["hold"] is not None

    await eventually(is_held)
    # When more than the retention passes
    await asyncio.sleep(3 * RETENTION_MS / 1000)
    # Then both are still there, their keys without a TTL
    for job_id in (running, held):
        assert await _status(replica, job_id) == 200
        assert await _ttls(redis, job_id) == (-1, -1)
    assert (await job(replica, running))["status"] == "running"
    assert (await job(replica, held))["status"] == "queued"
    # And they stay listed, with or without a status filter (a create or an end trims only finished jobs)
    ended = (await create(replica, {"input": "ends"}))["run_id"]
    assert (await replica.post(f"/v1/runs/{ended}/stop")).status == 200
    assert {running, held} <= set(await _listed(replica))
    assert running in await _listed(replica, "running") and held in await _listed(replica, "queued")


async def test_a_finished_job_expires_after_the_retention_with_its_key_and_listing(
    make_replica: ClientFactory, redis: Redis
) -> None:
    # Given a tiny retention and a job created with an Idempotency-Key that finished
    replica = await make_replica(runs_retention_ms=RETENTION_MS)
    body = {"input": "hello"}
    first = await create(replica, body, **{"Idempotency-Key": "retained-key"})
    job_id = first["run_id"]
    assert (await settled(replica, job_id))["status"] == "completed"
    events_ttl, view_ttl = await _ttls(redis, job_id)
    assert 0 < events_ttl <= RETENTION_MS and 0 < view_ttl <= RETENTION_MS

    # When the retention has passed since its end
    async def gone() -> bool:
        return await _status(replica, job_id) == 404

    await eventually(gone, timeout=5)
    # Then nothing of it is left, it is not listed, and its key creates a new job
    assert not await redis.exists(keys.events(job_id), keys.view(job_id))
    assert job_id not in await _listed(replica)
    again = await create(replica, body, **{"Idempotency-Key": "retained-key"})
    assert again["replayed"] is False and again["status"] == "queued"
