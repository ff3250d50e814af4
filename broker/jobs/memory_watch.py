"""Every replica's watch on how full Redis is (SPEC S4.4): `INFO memory` of every node about once a second.

Creates read the last verdict (`full`) and never ask Redis themselves, so the guard adds no command to a create.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from broker.jobs.room import past_mark
from broker.logging import get_logger
from broker.store.memory import NodeMemory, node_memory
from broker.store.outage import log_failure
from broker.tasks import cancel_all

WATCH_S = 1.0  #: how often a replica reads INFO memory (a flood passes the mark by at most this much writing)


class MemoryWatch:
    """The node past REDIS_MEMORY_HIGH of its maxmemory, if any, as last read; logged when that changes."""

    def __init__(self, redis: Redis, high: float, *, every_s: float = WATCH_S) -> None:
        self._redis = redis
        self._high = high
        self._every_s = every_s
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self.full: NodeMemory | None = None  #: the node past its mark at the last reading; None: room
        self._log = get_logger(MemoryWatch)

    async def start(self) -> None:
        """Read once (a replica started on a full Redis refuses from its first create), then every `every_s`."""
        await self._look_guarded()
        self._task = asyncio.create_task(self._run(), name="memory-watch")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_all([self._task])
            self._task = None

    async def look(self) -> NodeMemory | None:
        """One reading of every node; the verdict is kept for creates and its changes logged."""
        full = past_mark(await node_memory(self._redis), self._high)
        if full is not None and self.full is None:
            self._log.warning("Refusing creates: Redis is nearly full.", extra=self._fields(full))
        elif full is None and self.full is not None:
            self._log.info("Taking creates again: Redis has room.", extra={"node": self.full.node})
        self.full = full
        return full

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._every_s)
            await self._look_guarded()

    async def _look_guarded(self) -> None:
        """A failed reading keeps the last verdict (an unreachable Redis fails creates on its own), logged once."""
        try:
            await self.look()
        except Exception as error:  # the loop guard: log the first failure of a streak, look again next time
            if not self._failing:
                log_failure(self._log, error, outage="Could not read Redis memory.", bug="The memory watch failed.")
            self._failing = True
        else:
            self._failing = False

    def _fields(self, node: NodeMemory) -> dict[str, object]:
        return {"node": node.node, "usedBytes": node.used, "maxmemoryBytes": node.maxmemory, "high": self._high}
