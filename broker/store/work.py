"""The drivers' work doorbell stream and its consumer group, and what /readyz reports of the schedules."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from broker.store import keys


async def ensure_group(redis: Redis) -> None:
    """Create the drivers' group (and the stream); a group that exists is left alone."""
    try:
        await redis.xgroup_create(keys.WORK, keys.WORK_GROUP, id="0", mkstream=True)
    except ResponseError as error:
        if "BUSYGROUP" not in str(error):
            raise


async def scheduled_jobs(redis: Redis) -> int:
    """Jobs in the due schedules: every job not finished, driven or waiting (one pipeline)."""
    async with redis.pipeline(transaction=False) as pipe:
        for partition in keys.partitions():
            pipe.zcard(keys.due(partition))
        return sum(int(count) for count in await pipe.execute())
