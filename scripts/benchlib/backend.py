"""Where a broker round keeps its store: the run's single redis-server, or a Redis Cluster (benchlib.cluster).

A scenario that takes a `Backend` empties it before a round, reads the commands Redis ran (master by
master) and a stream's length, and starts its brokers with `backend.env` (REDIS_URL, and REDIS_CLUSTER).
"""

from __future__ import annotations

from typing import Protocol

from redis.asyncio import Redis

from benchlib.run import redis_calls


class Backend(Protocol):
    label: str  #: how the table names it: "single Redis", "cluster 3+3"

    @property
    def env(self) -> dict[str, str]:
        """The broker's Redis variables for this store."""
        ...

    async def flush(self) -> None:
        """Empty every master and reset its command statistics."""
        ...

    async def reset_stats(self) -> None: ...

    async def commands(self) -> list[int]:
        """Commands run since the last reset, master by master (the bench's own INFO/CONFIG left out)."""
        ...

    async def xlen(self, key: str) -> int: ...


class SingleRedis:
    """One redis-server (the run's own, or one started beside a cluster with the same binary)."""

    def __init__(self, client: Redis, url: str, label: str = "single Redis") -> None:
        self.client, self.url, self.label = client, url, label

    @property
    def env(self) -> dict[str, str]:
        return {"REDIS_URL": self.url}

    async def flush(self) -> None:
        await self.client.flushall()
        await self.reset_stats()

    async def reset_stats(self) -> None:
        await self.client.config_resetstat()

    async def commands(self) -> list[int]:
        return [redis_calls(await self.client.info("commandstats"))]

    async def xlen(self, key: str) -> int:
        return int(await self.client.xlen(key))
