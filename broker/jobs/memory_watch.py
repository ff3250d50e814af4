"""Every replica's watch on how full Redis is (SPEC S4.4): `INFO memory` of every node about once a second.

Creates ask `admit` and never ask Redis themselves, so the guard adds no command to a create. Between two readings
the replica counts what its own creates added, so a flood does not run past the mark for a whole second.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from broker.jobs.room import HYSTERESIS, NOTHING, cost, headroom, past_mark
from broker.logging import get_logger
from broker.store.memory import NodeMemory, node_memory
from broker.store.outage import log_failure
from broker.tasks import cancel_all

WATCH_S = 1.0  #: how often a replica reads INFO memory


class MemoryWatch:
    """The node past REDIS_MEMORY_HIGH of its maxmemory, if any; creates are refused while there is one.

    Refusing starts with a create that would pass the mark and ends with a reading that finds room again: one warn
    line and one info line per episode, never one per request."""

    def __init__(self, redis: Redis, high: float, *, every_s: float = WATCH_S) -> None:
        self._redis = redis
        self._high = high
        self._every_s = every_s
        self._task: asyncio.Task[None] | None = None
        self._failing = False
        self._readings: list[NodeMemory] = []
        self._since = NOTHING
        self._headroom: float | None = None  #: what creates may add before a node of the reading passes its mark
        self.full: NodeMemory | None = None  #: the node past its mark; None: creates are taken
        self._log = get_logger(MemoryWatch)

    async def start(self) -> None:
        """Read once (a replica started on a full Redis refuses from its first create), then every `every_s`."""
        await self._look_guarded()
        self._task = asyncio.create_task(self._run(), name="memory-watch")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_all([self._task])
            self._task = None

    @property
    def readings(self) -> tuple[NodeMemory, ...]:
        """The nodes as the last reading found them."""
        return tuple(self._readings)

    @property
    def refusing(self) -> bool:
        return self.full is not None

    def admit(self, body_bytes: int) -> bool:
        """Whether a new job of this execution body still leaves every node below its mark; counted if so."""
        if self.full is not None:
            return False
        if self._headroom is None:  # no node has a mark (no maxmemory): Redis never refuses a write for memory
            return True
        since = self._since.plus(body_bytes)
        if cost(since) < self._headroom - 1:  # clearly below every mark (worked out once per reading)
            self._since = since
            return True
        full = past_mark(self._readings, self._high, since)
        if full is not None:
            self._refusing(full)
            return False
        self._since = since
        return True

    async def look(self) -> NodeMemory | None:
        """One reading of every node; the verdict is kept for creates and its changes logged."""
        self._readings = await node_memory(self._redis)
        self._since = NOTHING
        self._headroom = headroom(self._readings, self._high)
        # while refusing, room is found only clearly below the mark (HYSTERESIS)
        full = past_mark(self._readings, self._high * (HYSTERESIS if self.full is not None else 1.0))
        if full is not None:
            self._refusing(full)
        elif self.full is not None:
            self._log.info("Taking creates again: Redis has room.", extra={"node": self.full.node})
        self.full = full
        return full

    def _refusing(self, node: NodeMemory) -> None:
        if self.full is None:
            fields = {
                "node": node.node,
                "usedBytes": node.used,
                "maxmemoryBytes": node.maxmemory,
                "unfinishedJobs": node.unfinished,
                "high": self._high,
            }
            self._log.warning("Refusing creates: Redis is nearly full.", extra=fields)
        self.full = node

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
