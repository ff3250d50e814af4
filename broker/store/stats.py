"""Cheap reads for the operator console (SPEC S8) that no other store module answers."""

from __future__ import annotations

from redis.asyncio import Redis

from broker.store import keys


async def board_outbox_lag(redis: Redis) -> int:
    """Board deliveries due and not yet acknowledged (acknowledged outbox entries are deleted)."""
    return int(await redis.xlen(keys.BOARD_OUTBOX))
