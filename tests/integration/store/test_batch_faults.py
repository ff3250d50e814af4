"""ScriptBatch (broker/store/batch.py) on the hard paths, against a redis-server of each test's own: a restart while
the pool holds idle connections, a Redis still loading its data when it answers again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from broker.store.batch import ScriptBatch
from broker.store.connection import connect
from tests.conftest import RedisServer, redis_7

ECHO = "redis.call('RPUSH', KEYS[1], ARGV[1]) return ARGV[1]"


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


async def test_calls_after_a_restart_go_through_though_the_pool_holds_connections_of_the_old_server(
    own_redis: RedisServer,
) -> None:
    client = connect(own_redis.url)
    try:
        batch, echo = ScriptBatch(client), client.register_script(ECHO)
        await asyncio.gather(*(client.blpop(["{faults}:none"], 0.05) for _ in range(8)))  # 8 idle connections
        assert await batch.run(echo, ["{faults}:restart"], ["before"]) == "before"

        own_redis.stop()
        own_redis.start()  # every pooled connection is now one the old server closed

        assert await asyncio.wait_for(batch.run(echo, ["{faults}:restart"], ["after"]), 30) == "after"
        assert await client.lrange("{faults}:restart", 0, -1) == ["before", "after"]
    finally:
        await client.aclose()


async def loading(client: Redis) -> None:
    """Until Redis answers LOADING (it reloads its data set)."""
    deadline = time.monotonic() + 10
    while (await client.info("persistence"))["loading"] != 1:
        assert time.monotonic() < deadline, "Redis did not start loading"
        await asyncio.sleep(0.01)


async def test_calls_made_while_redis_loads_its_data_wait_for_it_as_redis_pys_own_commands_do(tmp_path: Path) -> None:
    own_redis = RedisServer(tmp_path, "--appendonly", "no", "--enable-debug-command", "yes", binary=redis_7())
    own_redis.start()
    client, admin = connect(own_redis.url), connect(own_redis.url)
    try:
        batch, echo = ScriptBatch(client), client.register_script(ECHO)
        assert await batch.run(echo, ["{faults}:loading"], ["before"]) == "before"
        await admin.execute_command("DEBUG", "POPULATE", 20_000, "{faults}:data", 100)
        await admin.config_set("key-load-delay", 100)  # us a key: a few seconds of loading
        await admin.config_set("loading-process-events-interval-bytes", 1024)  # answering LOADING meanwhile
        reload = asyncio.create_task(admin.execute_command("DEBUG", "RELOAD"))
        probe = Redis(host="127.0.0.1", port=own_redis.port, decode_responses=True, retry=None)
        try:
            await loading(probe)
        finally:
            await probe.aclose()

        replies = batch.run(echo, ["{faults}:loading"], ["after"]), client.rpush("{faults}:own", "after")
        assert await asyncio.wait_for(asyncio.gather(*replies), 30) == ["after", 1]  # redis-py's retry waits
        await reload
        assert await client.lrange("{faults}:loading", 0, -1) == ["before", "after"]
    finally:
        await client.aclose()
        await admin.aclose()
        own_redis.stop()
