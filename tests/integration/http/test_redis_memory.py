"""A full Redis is an outage, and a nearly full one takes no new jobs (SPEC S4.4, S9): creates answer 503
`unavailable` with Retry-After, never 500, and are taken again once Redis has room."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.app import memory_key
from broker.store.connection import connect
from tests.conftest import RedisServer
from tests.integration.conftest import ClientFactory
from tests.redis_memory import fill, free

BODY = {"input": "hello " + "x" * 2000}
WATCH = "broker.jobs.memory_watch.MemoryWatch"


@pytest.fixture
async def small(small_redis: RedisServer) -> AsyncIterator[Redis]:
    client = connect(small_redis.url)
    yield client
    await client.aclose()


async def _broker(make_client: ClientFactory, server: RedisServer, **overrides: Any) -> TestClient[Any, Any]:
    return await make_client(redis_url=server.url, **overrides)


async def _answer_until(client: TestClient[Any, Any], wanted: int, *, timeout: float = 15.0) -> int:
    """Create until one answers `wanted`; every answer before it must be a 202 or a 503. How many were not."""
    deadline, others = time.monotonic() + timeout, 0
    while time.monotonic() < deadline:
        answer = await client.post("/v1/runs", json=BODY)
        assert answer.status in (202, 503), (answer.status, await answer.text())
        if answer.status == wanted:
            return others
        others += 1
        await asyncio.sleep(0.05)
    raise AssertionError(f"no {wanted} within {timeout}s")


def _refused(metrics: str, reason: str) -> float:
    line = f'hbr_creates_refused_total{{reason="{reason}"}} '
    return sum(float(row[len(line) :]) for row in metrics.splitlines() if row.startswith(line))


async def test_creates_into_a_nearly_full_redis_answer_503_until_it_has_room(
    make_client: ClientFactory, small_redis: RedisServer, small: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a Redis past REDIS_MEMORY_HIGH (0.9) of its maxmemory, under the mark that Redis itself refuses at
    await fill(small, 0.95)
    with caplog.at_level(logging.INFO, logger=WATCH):
        client = await _broker(make_client, small_redis)
        # When a create arrives
        answer = await client.post("/v1/runs", json=BODY)
        # Then it answers 503 unavailable, "nearly full", with Retry-After, and stores nothing
        body = await answer.json()
        assert answer.status == 503, body
        assert body["error"]["code"] == "unavailable" and body["error"]["type"] == "server_error"
        assert body["error"]["message"] == "Redis is nearly full; try again later"
        assert int(answer.headers["Retry-After"]) >= 1
        assert [key async for key in small.scan_iter(match="hbr:{p*}:*:events")] == []
        # And once Redis has room again, creates are taken
        await free(small)
        refused = 1 + await _answer_until(client, 202)
    # And the guard logged once when it turned on and once when it turned off, not per request
    lines = [(r.levelname, r.message) for r in caplog.records if r.name == WATCH]
    assert lines == [
        ("WARNING", "Refusing creates: Redis is nearly full."),
        ("INFO", "Taking creates again: Redis has room."),
    ]
    assert _refused(await (await client.get("/metrics")).text(), "redis_memory") == refused


async def test_a_replay_is_answered_while_redis_is_nearly_full(
    make_client: ClientFactory, small_redis: RedisServer, small: Redis
) -> None:
    # Given a job created with an Idempotency-Key, then Redis nearly full
    client = await _broker(make_client, small_redis)
    created = await client.post("/v1/runs", json=BODY, headers={"Idempotency-Key": "k-1"})
    assert created.status == 202
    await fill(small, 0.95)
    await client.app[memory_key].look()
    # When the same create is retried, and another key is used
    replayed = await client.post("/v1/runs", json=BODY, headers={"Idempotency-Key": "k-1"})
    other = await client.post("/v1/runs", json=BODY, headers={"Idempotency-Key": "k-2"})
    conflicting = await client.post("/v1/runs", json={"input": "other"}, headers={"Idempotency-Key": "k-1"})
    # Then the replay stores nothing and is answered; the new job is refused; a conflict is still a conflict
    assert replayed.status == 202 and replayed.headers["Idempotency-Replayed"] == "true"
    assert (await replayed.json())["run_id"] == (await created.json())["run_id"]
    assert other.status == 503 and (await other.json())["error"]["code"] == "unavailable"
    assert conflicting.status == 409


async def test_a_create_that_redis_refuses_for_memory_is_a_503(
    make_client: ClientFactory, small_redis: RedisServer, small: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a broker whose memory watch has not yet seen Redis fill up (it looks about once a second)
    client = await _broker(make_client, small_redis)
    await client.app[memory_key].stop()
    # When Redis is filled past its maxmemory, and a create arrives
    await fill(small, 1.5)
    with caplog.at_level(logging.WARNING):
        answer = await client.post("/v1/runs", json=BODY)
    # Then Redis refuses the write (OOM), and the answer is a 503 with Retry-After, logged at warn without traceback
    body = await answer.json()
    assert answer.status == 503 and body["error"]["code"] == "unavailable", body
    assert int(answer.headers["Retry-After"]) >= 1
    warned = [r for r in caplog.records if r.message == "Redis could not answer a request."]
    assert warned and all(r.exc_info is None for r in warned), [r.__dict__.get("error") for r in warned]
    assert all("maxmemory" in r.__dict__["error"] for r in warned), [r.__dict__["error"] for r in warned]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert _refused(await (await client.get("/metrics")).text(), "outage") == 1
    # And once Redis has room, the same create is taken
    await free(small)
    assert (await client.post("/v1/runs", json=BODY)).status == 202


def _gauge(metrics: str, sample: str) -> float:
    [value] = [float(row[len(sample) + 1 :]) for row in metrics.splitlines() if row.startswith(sample + " ")]
    return value


async def test_metrics_show_how_near_redis_is_to_the_guard(
    make_client: ClientFactory, small_redis: RedisServer, small: Redis
) -> None:
    # Given a Redis past REDIS_MEMORY_HIGH of its maxmemory, as the memory watch last read it
    client = await _broker(make_client, small_redis)
    await fill(small, 0.95)
    await client.app[memory_key].look()
    # When /metrics is scraped, then it shows the node's memory, the guard's reading past its mark, and the refusal
    full = await (await client.get("/metrics")).text()
    assert _gauge(full, 'hbr_redis_memory_max_bytes{node="redis"}') > 0
    assert _gauge(full, 'hbr_redis_memory_used_bytes{node="redis"}') > 0
    assert _gauge(full, 'hbr_redis_memory_guard_ratio{node="redis"}') >= 1
    assert _gauge(full, "hbr_redis_memory_refusing") == 1
    # And once Redis has room again, below the mark and not refusing
    await free(small)
    await client.app[memory_key].look()
    roomy = await (await client.get("/metrics")).text()
    assert _gauge(roomy, 'hbr_redis_memory_guard_ratio{node="redis"}') < 1
    assert _gauge(roomy, "hbr_redis_memory_refusing") == 0
