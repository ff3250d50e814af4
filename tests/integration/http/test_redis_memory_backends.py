"""The memory guard on a single Redis and on a cluster (SPEC S4.4, S9): every master is watched, and one master
near its maxmemory is enough for creates to answer 503 until it has room again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis, RedisCluster

from broker.store.connection import is_cluster
from broker.store.memory import node_memory
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory

pytestmark = BOTH_BACKENDS
BODY = {"input": "hello"}


async def _set_maxmemory(redis: Redis, value: int, *, only: int | None = None) -> None:
    """CONFIG SET maxmemory on every master, or on the `only`-th."""
    if not is_cluster(redis):
        await redis.config_set("maxmemory", value)
        return
    cluster = await cast(RedisCluster, redis).initialize()
    masters = cluster.get_primaries()
    for node in masters if only is None else [masters[only]]:
        await cluster.config_set("maxmemory", value, target_nodes=node)


@pytest.fixture
async def limited(redis: Redis) -> AsyncIterator[Redis]:
    """The store, its maxmemory set back to none after the test (the servers are shared)."""
    yield redis
    await _set_maxmemory(redis, 0)


async def _until(client: TestClient[Any, Any], wanted: int, *, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = await client.post("/v1/runs", json=BODY)
        assert answer.status in (202, 503), (answer.status, await answer.text())
        if answer.status == wanted:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {wanted} within {timeout}s")


async def test_every_master_is_read_with_its_unfinished_jobs(client: TestClient[Any, Any], limited: Redis) -> None:
    # Given jobs that have not ended, and a maxmemory on every master
    for _ in range(20):
        assert (await client.post("/v1/runs", json=BODY)).status == 202
    await _set_maxmemory(limited, 1 << 30)
    # When the memory of the store is read
    readings = await node_memory(limited)
    # Then every master is there, with its maxmemory, and the unfinished jobs are counted on their masters
    assert len(readings) == (3 if is_cluster(limited) else 1)
    assert all(reading.maxmemory == 1 << 30 and reading.used > 0 for reading in readings)
    assert sum(reading.unfinished for reading in readings) == 20


async def test_one_master_near_its_maxmemory_refuses_creates_until_it_has_room(
    make_client: ClientFactory, limited: Redis
) -> None:
    # Given a broker taking creates
    client = await make_client()
    assert (await client.post("/v1/runs", json=BODY)).status == 202
    # When one master's maxmemory comes down to just above what it holds
    used = (await node_memory(limited))[0].used
    await _set_maxmemory(limited, int(used * 1.05), only=0)
    # Then creates answer 503 once the broker has read it (about once a second), never 500
    await _until(client, 503)
    # And once that master has room again, creates are taken
    await _set_maxmemory(limited, 0)
    await _until(client, 202)
