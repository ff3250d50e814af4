"""A full Redis is an outage for the driver too (SPEC S9): a write Redis refuses for memory (OOM) is logged at warn
without a traceback and retried, and the job still finishes once Redis has room."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from broker.store.connection import connect
from tests.conftest import RedisServer
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled
from tests.redis_memory import fill, free

LOST = "Lost Redis while driving a job."


@pytest.fixture
async def small(small_redis: RedisServer) -> AsyncIterator[Redis]:
    client = connect(small_redis.url)
    yield client
    await client.aclose()


async def test_a_driver_write_refused_for_memory_is_retried_and_the_job_finishes(
    make_replica: ClientFactory, small_redis: RedisServer, small: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a replica driving a job whose Hermes run takes a while, on a Redis with a maxmemory
    replica = await make_replica(redis_url=small_redis.url, redis_memory_high=1.0)
    created = await create(replica, {"input": "hello sleep:2 deltas:20"})

    async def running() -> bool:
        return (await job(replica, created["run_id"]))["status"] == "running"

    await eventually(running)
    with caplog.at_level(logging.WARNING, logger="broker"):
        # When Redis fills up past its maxmemory while the run streams its events (and stays full: the room a
        # refused write's buffers free is taken again, so no write of the driver slips through it)
        async def keep_full() -> None:
            while True:
                await fill(small, 1.5)
                await asyncio.sleep(0.02)

        filling = asyncio.create_task(keep_full())

        # Then the driver's next write is refused, which it logs at warn, without a traceback
        async def warned() -> bool:
            return any(record.message == LOST for record in caplog.records)

        try:
            await eventually(warned)
        finally:
            filling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await filling
        assert all(record.exc_info is None for record in caplog.records if record.message == LOST)
        # And once Redis has room again, the job is driven to its end with Hermes's output
        await free(small)
        done = await settled(replica, created["run_id"], timeout=30)
    assert done["status"] == "completed" and done["output"], done
    errors = [(record.name, record.message) for record in caplog.records if record.levelno >= logging.ERROR]
    assert errors == []
