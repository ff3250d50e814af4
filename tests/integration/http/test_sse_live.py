"""Live follow through the replica's hub: order, fan-out with bounded Redis connections, replicas, disconnects,
slow clients, Redis reconnects and shutdown (SPEC S3.3, DESIGN invariants 7 and 8)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
import pytest
from redis.asyncio import Redis

from broker.http.appkeys import metrics_key
from broker.http.hub import BLOCK_MS, Hub, hub_key
from broker.store.connection import MAX_CONNECTIONS
from tests.integration.conftest import ClientFactory
from tests.integration.http.test_sse_support import (
    Client,
    Comment,
    Frame,
    SseReader,
    accepted,
    append,
    completed,
    create_job,
    delta,
    eventually,
    open_stream,
)

BLOCK_S = 0.5  # RUNS_EVENT_BLOCK of the integration config


def hub_of(client: Client) -> Hub:
    return client.server.app[hub_key]


async def connections(redis: Redis, since: int) -> int:
    """Redis connections opened since client id `since` (older ones are earlier tests' apps, being collected)."""
    return sum(int(entry["id"]) >= since for entry in await redis.client_list())


def open_streams(client: Client) -> float:
    return float(client.server.app[metrics_key].sse_open._value.get())


async def test_live_events_arrive_in_order_and_idle_streams_get_keepalives(client: Client, redis: Redis) -> None:
    # Given a client following a queued job
    job = await create_job(client)
    reader = await open_stream(client, job)
    assert [frame.data["event"] for frame in await reader.frames(1)] == ["job.queued"]
    # When nothing happens for longer than RUNS_EVENT_BLOCK, a keepalive comment comes
    assert await reader.item(timeout=BLOCK_S + 2) == Comment("keepalive")
    # When the driver appends events one by one
    ids: list[str] = []
    ids += await append(redis, job, [accepted(job)])
    for word in ("a", "b", "c"):
        ids += await append(redis, job, [delta(job, word)])
    ids += await append(redis, job, [completed(job)])
    # Then they arrive in order, the terminal event last, then the stream closes
    items = await reader.rest()
    assert [item.id for item in items if isinstance(item, Frame)] == ids
    assert items[-1] == Comment("stream closed")


async def test_a_new_stream_wakes_the_blocked_reader(client: Client, redis: Redis) -> None:
    # Given the hub blocked on one job's stream
    first, second = await create_job(client, "one"), await create_job(client, "two")
    await (await open_stream(client, first)).frames(1)
    await eventually(lambda: hub_of(client).subscribers == 1)
    # When a client follows a second job and an event is appended to it
    reader = await open_stream(client, second)
    await reader.frames(1)
    await eventually(lambda: hub_of(client).subscribers == 2)
    await append(redis, second, [accepted(second)])
    # Then it arrives long before the reader's BLOCK would have ended
    started = asyncio.get_running_loop().time()
    assert [frame.data["event"] for frame in await reader.frames(1, timeout=BLOCK_MS / 2000)] == ["job.accepted"]
    assert asyncio.get_running_loop().time() - started < BLOCK_MS / 2000


async def test_500_subscribers_see_the_same_events_over_a_bounded_number_of_connections(
    client: Client, redis: Redis
) -> None:
    # Given 500 clients following one job through one replica
    since = int(await redis.client_id())  # this test's client, opened before the app
    job = await create_job(client)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        responses = await asyncio.gather(*(session.get(client.make_url(f"/v1/runs/{job}/events")) for _ in range(500)))
        readers = [SseReader(response) for response in responses]
        await asyncio.gather(*(reader.frames(1, timeout=30) for reader in readers))
        await eventually(lambda: hub_of(client).subscribers == 500, timeout=30)
        assert open_streams(client) == 500
        peak = await connections(redis, since)
        # When the job runs
        ids = await append(redis, job, [accepted(job)])
        for chunk in range(10):
            ids += await append(redis, job, [delta(job, f"{chunk}.{n}") for n in range(5)])
            peak = max(peak, await connections(redis, since))
        ids += await append(redis, job, [completed(job)])
        seen = await asyncio.gather(*(reader.frames(timeout=30) for reader in readers))
        peak = max(peak, await connections(redis, since))
    # Then every client saw exactly the job's events, in order, once
    assert all([frame.id for frame in frames] == ids for frames in seen)
    assert len({tuple(frame.data["delta"] for frame in frames[1:-1]) for frames in seen}) == 1
    # And Redis saw at most the app's pool (the hub's connection is one of it) plus this test's client
    assert peak <= MAX_CONNECTIONS + 2, peak
    await eventually(lambda: open_streams(client) == 0)


async def test_reconnecting_to_another_replica_misses_nothing_and_repeats_nothing(
    make_client: ClientFactory, redis: Redis
) -> None:
    # Given two replicas sharing one Redis, and a client on the first one mid-job
    one, two = await make_client(), await make_client()
    job = await create_job(one)
    ids = await append(redis, job, [accepted(job), delta(job, "a")])
    reader = await open_stream(one, job)
    before = await reader.frames(3)
    reader.response.close()
    # When events keep coming while it reconnects to the second replica with its last id
    ids += await append(redis, job, [delta(job, "b")])
    resumed = await open_stream(two, job, headers={"Last-Event-ID": before[-1].id})
    ids += await append(redis, job, [delta(job, "c"), completed(job)])
    after = await resumed.frames()
    # Then the two parts are the whole stream, once
    assert [frame.id for frame in before + after][1:] == ids


async def test_a_client_that_leaves_is_noticed_within_the_event_block(
    client: Client, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="broker.http.sse")
    job = await create_job(client)
    reader = await open_stream(client, job)
    await reader.frames(1)
    await eventually(lambda: open_streams(client) == 1 and hub_of(client).subscribers == 1)
    # When the client goes away without a word
    reader.response.close()
    # Then the handler ends within RUNS_EVENT_BLOCK (plus a margin) and says so
    took = await eventually(lambda: open_streams(client) == 0, timeout=BLOCK_S + 1.5)
    assert took <= BLOCK_S + 1.5
    assert hub_of(client).subscribers == 0
    closed = [record for record in caplog.records if record.message == "Closed an event stream."]
    assert len(closed) == 1 and closed[0].__dict__["job"] == job and closed[0].__dict__["sent"] == 1
    assert {"after", "durationMs"} <= set(closed[0].__dict__)


async def test_a_slow_client_falls_back_to_reading_the_stream(client: Client, redis: Redis) -> None:
    # Given a subscriber whose hub buffer holds only 3 frames
    hub_of(client).queue_limit = 3
    job = await create_job(client)
    reader = await open_stream(client, job)
    await reader.frames(1)
    await eventually(lambda: hub_of(client).subscribers == 1)
    # When one read brings far more than that
    ids = await append(redis, job, [accepted(job), *(delta(job, str(n)) for n in range(40)), completed(job)])
    # Then it overflowed, re-read the stream, and still saw everything once, in order
    assert [frame.id for frame in await reader.frames()] == ids
    assert hub_of(client).overflows >= 1


async def test_the_hub_reconnects_when_redis_drops_its_connection(client: Client, redis: Redis) -> None:
    job = await create_job(client)
    reader = await open_stream(client, job)
    await reader.frames(1)
    await eventually(lambda: hub_of(client).subscribers == 1 and hub_of(client).client_id is not None)
    killed = hub_of(client).client_id
    # When Redis drops the hub's connection and events keep coming
    await redis.execute_command("CLIENT", "KILL", "ID", killed)
    ids = await append(redis, job, [accepted(job), delta(job, "x")])
    await eventually(lambda: hub_of(client).client_id not in (None, killed))
    ids += await append(redis, job, [completed(job)])
    # Then the subscriber sees them all, once
    assert [frame.id for frame in await reader.frames()] == ids


async def test_shutdown_ends_open_streams_without_a_terminal_event(client: Client, redis: Redis) -> None:
    # Given clients following a running job
    job = await create_job(client)
    await append(redis, job, [accepted(job)])
    readers = [await open_stream(client, job) for _ in range(3)]
    await asyncio.gather(*(reader.frames(2) for reader in readers))
    rests: list[asyncio.Task[list[Any]]] = [asyncio.create_task(reader.rest()) for reader in readers]
    await eventually(lambda: hub_of(client).subscribers == 3)
    # When the replica shuts down
    await asyncio.wait_for(client.server.close(), timeout=5)
    # Then every stream ended cleanly, with no terminal event and no closing comment
    for rest in rests:
        items = await asyncio.wait_for(rest, timeout=5)
        assert all(item == Comment("keepalive") for item in items)
