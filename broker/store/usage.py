"""Each fairness key's usage in Redis (SPEC S4.5): hourly buckets, counted once per fact.

A job write that starts or settles a run adds the fact to its partition's `hbr:{pN}:usage` zset, in the same script
(no round trip of its own, and nothing between the fact and its event for a crash to split). Every replica sweeps
those zsets: it counts a batch of facts with one usage_record.lua per hour (the hour's counters, its ranking and
its markers share the hour's tag, so a fact is counted at most once whoever sweeps it, however often), then takes
them off the zsets. A crash between the two leaves the facts for the next sweep, which finds their markers.

Reads: one key's buckets are one HGET per hour of the range; the top keys are the hours' rankings (ZRANGE, only
the keys that used Hermes in those hours) summed, then one HMGET per hour for the chosen keys.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import cast

import orjson
from attrs import frozen
from redis.asyncio import Redis

from broker.store import keys
from broker.store.replies import scored, text
from broker.store.scripts import Args, Scripts, run_many
from projections.usage import FIELDS, Used

HOUR_MS = 3_600_000
BATCH = 200  #: facts taken per partition and sweep
Counters = tuple[int, ...]  #: the eight counters of `FIELDS`
ZERO: Counters = (0,) * len(FIELDS)


def hour_of(at_ms: int) -> int:
    """The start (epoch seconds) of the hour `at_ms` falls in: the fact's bucket."""
    return at_ms // HOUR_MS * HOUR_MS // 1000


def encode(used: Used) -> bytes:
    """A fact as its partition zset holds it."""
    return orjson.dumps([used.marker, used.key, used.at_ms, *used.counts()])


def decode(member: str) -> Used | None:
    """A fact read back (None: not one this version can read: it stays for a replica that can)."""
    try:
        marker, key, at_ms, *counts = orjson.loads(member)
        return Used(marker=marker, key=key, at_ms=int(at_ms), **dict(zip(FIELDS, map(int, counts), strict=True)))
    except (ValueError, TypeError):
        return None


def add(a: Counters, b: Counters) -> Counters:
    return tuple(x + y for x, y in zip(a, b, strict=True))


@frozen
class Pending:
    """A fact waiting in a partition's zset."""

    partition: int
    member: str
    used: Used | None


class UsageStore:
    def __init__(self, redis: Redis, *, retention_ms: int) -> None:
        self._redis = redis
        scripts = Scripts(redis)
        self._script = scripts.usage_record
        self._replace = scripts.usage_replace
        self._retention_ms = retention_ms

    async def pending(self, most: int | None = BATCH) -> list[Pending]:
        """Facts waiting to be counted, the oldest `most` per partition (None: all; one pipeline)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for partition in keys.partitions():
                pipe.zrange(keys.usage_pending(partition), 0, -1 if most is None else most - 1)
            replies = cast(list[list[object]], await pipe.execute())
        return [
            Pending(partition, text(member), decode(text(member)))
            for partition, reply in enumerate(replies)
            for member in reply
        ]

    async def count_job(self, job_id: str) -> list[Used]:
        """Count the job's facts waiting in its partition now, not at the next sweep (a run of a key with a token
        budget, SPEC S4.4: its tokens count before its slot goes to another run); the sweep clears them. The facts
        counted now (not by another counter before)."""
        members = await self._redis.zrange(keys.usage_pending(keys.partition_of(job_id)), 0, -1)
        facts = [used for used in map(decode, map(text, members)) if used and used.marker.startswith(f"{job_id}:")]
        if not facts:
            return []
        return [used for used, new in zip(facts, await self.count(facts), strict=True) if new]

    async def count(self, facts: Sequence[Used]) -> list[bool]:
        """Count each fact in its hour unless it was counted before; True for those counted now (one pipeline)."""
        hours: dict[int, list[int]] = defaultdict(list)
        for index, used in enumerate(facts):
            hours[hour_of(used.at_ms)].append(index)
        calls: list[tuple[Sequence[str], Args]] = []
        for hour, indexes in hours.items():
            args: list[str | int] = [self.expiry(hour)]
            for index in indexes:
                used = facts[index]
                args.extend((used.marker, used.key, *used.counts()))
            calls.append((keys.usage(hour).all, args))
        counted = [False] * len(facts)
        for indexes, reply in zip(hours.values(), await run_many(self._redis, self._script, calls), strict=True):
            for index, flag in zip(indexes, cast(list[int], reply), strict=True):
                counted[index] = int(flag) == 1
        return counted

    async def clear(self, done: Sequence[Pending]) -> None:
        """Take counted facts off their partitions' zsets (one pipeline)."""
        if not done:
            return
        by_partition: dict[int, list[str]] = defaultdict(list)
        for item in done:
            by_partition[item.partition].append(item.member)
        async with self._redis.pipeline(transaction=False) as pipe:
            for partition, members in by_partition.items():
                pipe.zrem(keys.usage_pending(partition), *members)
            await pipe.execute()

    async def hours(self, hours: Sequence[int]) -> list[dict[str, Counters]]:
        """Every key's counters in each of `hours` (one pipeline; for the rebuild)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for hour in hours:
                pipe.hgetall(keys.usage(hour).counters)
            replies = cast(list[dict[object, object]], await pipe.execute())
        return [{text(key): _counters(value) for key, value in reply.items()} for reply in replies]

    async def replace(self, hour: int, counters: dict[str, Counters], markers: Sequence[str]) -> bool:
        """Replace the hour's usage with `counters` (the facts of `markers`) unless it counted a fact not among them
        since (False: refused)."""
        args: list[str | int] = [self.expiry(hour), len(markers), *markers]
        for key, values in counters.items():
            args.extend((key, ",".join(map(str, values)), values[FIELDS.index("hermes_ms")]))
        return int(cast(int, await self._replace(keys=keys.usage(hour).all, args=args))) == 1

    def expiry(self, hour: int) -> int:
        """When an hour's usage keys expire: RUNS_RETENTION after the hour's end (epoch ms)."""
        return hour * 1000 + HOUR_MS + self._retention_ms

    async def buckets(self, key: str, hours: Sequence[int]) -> list[Counters]:
        """The key's counters in each of `hours` (epoch seconds), in one pipeline."""
        if not hours:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for hour in hours:
                pipe.hget(keys.usage(hour).counters, key)
            replies = await pipe.execute()
        return [_counters(reply) for reply in replies]

    async def ranked(self, hours: Sequence[int]) -> dict[str, int]:
        """Every key that used Hermes in `hours` -> its Hermes ms over them (one pipeline of the hours' rankings)."""
        totals: dict[str, int] = defaultdict(int)
        if not hours:
            return totals
        async with self._redis.pipeline(transaction=False) as pipe:
            for hour in hours:
                pipe.zrange(keys.usage(hour).top, 0, -1, withscores=True)
            replies = await pipe.execute()
        for reply in replies:
            for key, ms in scored(reply):
                totals[key] += int(ms)
        return totals

    async def totals(self, chosen: Sequence[str], hours: Sequence[int]) -> list[Counters]:
        """The counters of each of `chosen` summed over `hours` (one HMGET per hour, in one pipeline)."""
        sums = [ZERO] * len(chosen)
        if not chosen or not hours:
            return sums
        async with self._redis.pipeline(transaction=False) as pipe:
            for hour in hours:
                pipe.hmget(keys.usage(hour).counters, list(chosen))
            replies = await pipe.execute()
        for reply in replies:
            for index, value in enumerate(cast(list[object], reply)):
                sums[index] = add(sums[index], _counters(value))
        return sums


def _counters(value: object) -> Counters:
    if value is None:
        return ZERO
    parts = text(value).split(",")
    if len(parts) != len(FIELDS) or not all(part.isdigit() for part in parts):
        return ZERO
    return tuple(int(part) for part in parts)
