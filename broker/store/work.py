"""The drivers' work doorbell stream and its consumer group."""

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
