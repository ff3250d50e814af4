"""Cheap reads for the operator console (SPEC S8) that no other store module answers."""

from __future__ import annotations

from redis.asyncio import Redis

from broker.store import keys


async def board_outbox_lag(redis: Redis) -> int:
    """Board deliveries due and not yet acknowledged (acknowledged outbox entries are deleted)."""
    async with redis.pipeline(transaction=False) as pipe:
        for partition in keys.partitions():
            pipe.xlen(keys.board_outbox(partition))
        return sum(int(length) for length in await pipe.execute())
