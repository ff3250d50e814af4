"""Keeps each partition's fair top zset (`hbr:{pN}:fair:top`, the keys with most waiting jobs, SPEC S4.2) in step
with its fair hash, where an older broker's scripts count alone (a rolling upgrade): a slice of every partition
per REPAIR_MS (broker/jobs/fair_top.py), one script per partition in one pipeline, each call bounded
(fair_top_repair.lua)."""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from broker.store import keys
from broker.store.replies import ints_and_ids
from broker.store.scripts import Args, run_many

#: How often a replica mends a slice of every partition's top zset.
REPAIR_MS = 10_000
#: Fields of the hash and of the zset one call scans at most.
SLICE = 200
DONE = "done"  #: a scan that reached its end in this round


class FairTopRepair:
    """One replica's walk over the partitions' fair hashes and top zsets (cursors kept here; a restart begins
    again, which only mends what is left)."""

    def __init__(self, redis: Redis, script: AsyncScript) -> None:
        self._redis = redis
        self._script = script
        self._cursors = {partition: ("0", "0") for partition in keys.partitions()}

    async def slice(self) -> int:
        """One call per partition, each scan on from where the last left it; a partition whose two scans both
        reached their ends begins again. The entries mended."""
        self._cursors = {p: ("0", "0") if c == (DONE, DONE) else c for p, c in self._cursors.items()}
        return await self._rest()

    async def all(self) -> int:
        """Walk every partition's hash and zset to their ends (tests, tools): the entries mended."""
        mended = await self.slice()
        while any(cursors != (DONE, DONE) for cursors in self._cursors.values()):
            mended += await self._rest()
        return mended

    async def _rest(self) -> int:
        """A slice of the partitions still walking (none begins again)."""
        walking = {p: c for p, c in self._cursors.items() if c != (DONE, DONE)}
        calls: list[tuple[Sequence[str], Args]] = [
            ([keys.fair(p), keys.fair_top(p)], [*c, SLICE]) for p, c in walking.items()
        ]
        mended = 0
        for partition, reply in zip(walking, await run_many(self._redis, self._script, calls), strict=True):
            hash_cursor, zset_cursor, count = ints_and_ids(reply)
            self._cursors[partition] = (_next(hash_cursor), _next(zset_cursor))
            mended += int(count)
        return mended


def _next(cursor: str) -> str:
    return DONE if cursor in ("0", DONE) else cursor
