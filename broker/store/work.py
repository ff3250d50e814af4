"""The drivers' work doorbell stream and its consumer group, and what /readyz reports of the schedules."""

from __future__ import annotations

from typing import cast

from attrs import frozen
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from broker.store import keys


@frozen
class QueueStats:
    depth: int  #: entries not yet delivered to a driver, plus delivered but not acknowledged
    oldest_ms: int | None  #: stream-id time of the oldest of them
    scheduled: int = 0  #: jobs in the due schedule: every job not finished, driven or waiting


async def ensure_group(redis: Redis) -> None:
    """Create the drivers' group (and the stream); a group that exists is left alone."""
    try:
        await redis.xgroup_create(keys.WORK, keys.WORK_GROUP, id="0", mkstream=True)
    except ResponseError as error:
        if "BUSYGROUP" not in str(error):
            raise


async def queue_stats(redis: Redis) -> QueueStats:
    groups = cast(list[dict[str, object]], await redis.xinfo_groups(keys.WORK))
    group = next((g for g in groups if _text(g.get("name")) == keys.WORK_GROUP), None)
    async with redis.pipeline(transaction=False) as pipe:
        for partition in keys.partitions():
            pipe.zcard(keys.due(partition))
        scheduled = sum(int(count) for count in await pipe.execute())
    if group is None:
        return QueueStats(depth=0, oldest_ms=None, scheduled=scheduled)
    last_delivered = _text(group.get("last-delivered-id")) or "0-0"
    pending = int(cast(int, group.get("pending") or 0))
    oldest = await _oldest(redis, last_delivered, pending)
    undelivered = await redis.xrange(keys.WORK, min=f"({last_delivered}", max="+", count=1000)
    return QueueStats(depth=pending + len(cast(list[object], undelivered)), oldest_ms=oldest, scheduled=scheduled)


async def _oldest(redis: Redis, last_delivered: str, pending: int) -> int | None:
    if pending:
        summary = cast(dict[str, object], await redis.xpending(keys.WORK, keys.WORK_GROUP))
        first = _text(summary.get("min"))
        if first:
            return int(first.split("-")[0])
    entries = cast(list[tuple[str, object]], await redis.xrange(keys.WORK, min=f"({last_delivered}", max="+", count=1))
    return int(entries[0][0].split("-")[0]) if entries else None


def _text(value: object) -> str | None:
    if isinstance(value, bytes):
        return value.decode()
    return None if value is None else str(value)
