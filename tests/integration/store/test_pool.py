"""The single-Redis client's lean pool (broker/store/pool.py) against a real redis-server: bounded, fair to
waiters, and never handing out a connection that still holds another command's reply."""

from __future__ import annotations

import asyncio
import contextlib

from broker.store.connection import connect
from broker.store.pool import LeanBlockingPool
from tests.conftest import RedisServer


async def test_more_callers_than_connections_all_get_one_in_turn(redis_server: RedisServer) -> None:
    client = connect(redis_server.url, max_connections=2)
    try:
        pool = client.connection_pool
        assert isinstance(pool, LeanBlockingPool)
        # 12 callers, each holding a connection for 50 ms (BLPOP on an empty list), over 2 connections
        replies = await asyncio.wait_for(
            asyncio.gather(*(client.blpop([f"hbr:test:empty:{i}"], timeout=0.05) for i in range(12))), 10
        )
        assert replies == [None] * 12
        assert len(pool._available_connections) + len(pool._in_use_connections) <= 2
        assert not pool._in_use_connections
        assert await client.ping()
    finally:
        await client.aclose()


async def test_a_cancelled_command_leaves_no_reply_for_the_next(redis_server: RedisServer) -> None:
    client = connect(redis_server.url, max_connections=1)
    try:
        await client.set("hbr:test:value", "mine")
        waiting = asyncio.create_task(client.blpop(["hbr:test:list"], timeout=5))
        await asyncio.sleep(0.1)  # sent, blocked in Redis
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        await client.rpush("hbr:test:list", "theirs")  # the cancelled BLOCK would now have had a reply
        assert await client.get("hbr:test:value") == "mine"
        assert await client.lrange("hbr:test:list", 0, -1) == ["theirs"]
    finally:
        await client.aclose()


async def test_a_restarted_redis_is_reconnected(redis_server: RedisServer) -> None:
    client = connect(redis_server.url)
    try:
        await client.set("hbr:test:before", "1")
        redis_server.stop()
        redis_server.start()  # AOF: what was acknowledged is there again
        assert await client.get("hbr:test:before") == "1"
    finally:
        await client.aclose()


async def test_waiters_get_the_connection_first_come_first_served_and_a_cancelled_waiter_leaks_none(
    redis_server: RedisServer,
) -> None:
    client = connect(redis_server.url, max_connections=1)
    try:
        pool = client.connection_pool
        order: list[int] = []

        async def numbered(i: int) -> None:
            await client.incr("hbr:test:counter")
            order.append(i)

        holder = asyncio.create_task(client.blpop(["hbr:test:empty"], timeout=0.3))  # the one connection
        await asyncio.sleep(0.05)
        gone = asyncio.create_task(client.get("hbr:test:value"))  # waits, then gives up waiting
        waiters = [asyncio.create_task(numbered(i)) for i in range(5)]
        await asyncio.sleep(0.05)
        gone.cancel()
        await asyncio.wait_for(asyncio.gather(holder, *waiters), 5)
        assert order == [0, 1, 2, 3, 4]
        assert await client.get("hbr:test:counter") == "5"
        assert not pool._in_use_connections and len(pool._available_connections) == 1
    finally:
        await client.aclose()
