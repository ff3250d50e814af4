"""Pub/sub nudges: "the stream of job J changed outside its owner; look now" (stop, approval).

Classic PUBLISH reaches the subscribers of every node of a cluster, so a replica subscribes on one node (the
cluster client's pub/sub picks the node of the channel's slot); when that node goes away the subscription
ends, and the caller subscribes again after the topology was re-read. Nudges are hints: a runner also
re-reads its stream on its own."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import cast

from redis.asyncio import Redis, RedisCluster

from broker.store import keys
from broker.store.connection import is_cluster


async def nudge(redis: Redis, job_id: str) -> None:
    await redis.publish(keys.SIGNALS, job_id)


async def nudges(redis: Redis) -> AsyncIterator[str]:
    """Job ids as they are published; ends (raises) when the connection drops, so callers re-subscribe."""
    if is_cluster(redis):
        await cast(RedisCluster, redis).nodes_manager.initialize()  # a failover moved the node, maybe
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe(keys.SIGNALS)
        async for message in pubsub.listen():
            if message.get("type") == "message":
                data = message["data"]
                yield data.decode() if isinstance(data, bytes) else str(data)
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
