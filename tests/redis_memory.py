"""Filling a Redis with a `maxmemory` and freeing it again, for the tests of a full Redis (SPEC S4.4, S9)."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.exceptions import OutOfMemoryError

FILLER = "test:filler:"  #: no key of the broker starts so
CHUNK = 64 * 1024


async def used_share(redis: Redis) -> float:
    info = await redis.info("memory")
    return int(info["used_memory"]) / int(info["maxmemory"])


async def fill(redis: Redis, share: float) -> int:
    """Write filler keys until `used_memory` passes `share` of `maxmemory` (past 1: until Redis refuses even a
    small write for memory); the number of keys written.

    A write's own query buffer counts in `used_memory`: a big write may be refused while a small one would still
    be taken, so the chunks shrink until the smallest is refused too."""
    written, chunk = 0, CHUNK
    while await used_share(redis) <= share:
        try:
            await redis.set(f"{FILLER}{written}", b"x" * chunk)
        except OutOfMemoryError:
            if chunk <= 64:
                break
            chunk //= 4
            continue
        written += 1
    return written


async def free(redis: Redis) -> None:
    """Delete every filler key (deletes are taken even past maxmemory)."""
    keys = [key async for key in redis.scan_iter(match=f"{FILLER}*", count=1000)]
    if keys:
        await redis.delete(*keys)
