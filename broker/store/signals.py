"""Pub/sub nudges: "the stream of job J changed outside its owner; look now" (stop, approval)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from redis.asyncio import Redis

from broker.store import keys


async def nudge(redis: Redis, job_id: str) -> None:
    await redis.publish(keys.SIGNALS, job_id)


async def nudges(redis: Redis) -> AsyncIterator[str]:
    """Job ids as they are published; ends (raises) when the connection drops, so callers re-subscribe."""
    pubsub = redis.pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe(keys.SIGNALS)
        async for message in pubsub.listen():
            if message.get("type") == "message":
                data = message["data"]
                yield data.decode() if isinstance(data, bytes) else str(data)
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
