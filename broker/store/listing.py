"""The job listing of SPEC S3.9, read from the indexes the append script keeps (see `keys.runs`): one per
partition and status, merged here (on a single Redis in one MULTI, on a cluster in one pipeline per node).

Jobs are ordered by their latest change, newest first; ties (same ms) by id, descending. A page ends at a
position `(score, job id)` and the next page starts strictly below it. A job's score only grows, so a job
shown once is above every later cursor of the same listing and never shown again; a job that changes
while the listing is paged moves to the front and is simply not seen by the pages still to come.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from attrs import frozen
from redis.asyncio import Redis

from broker.events import JobStatus
from broker.store import keys, lean
from broker.store.connection import is_cluster
from broker.store.scripts import source
from projections.job import JobView


@frozen(order=True)
class Position:
    """A place in the listing order: the index score (ms of the job's latest change) and the job id."""

    score: int
    job_id: str


@frozen
class Page:
    jobs: list[JobView]
    next: Position | None  #: where the next page starts (strictly below), None: this was the last page


class Listing:
    """Pages over the listing indexes; reads only, never writes (expired entries are skipped)."""

    def __init__(self, redis: Redis, *, retention_ms: int) -> None:
        self._redis = redis
        self._retention_ms = retention_ms

    async def page(self, statuses: Sequence[JobStatus] | None, limit: int, after: Position | None, now_ms: int) -> Page:
        """Up to `limit` jobs strictly below `after` (from the top when None), in one of `statuses` (any)."""
        # Entries of finished jobs older than the retention belong to expired jobs (trimmed when a job of the
        # same status ends); a job that waits or runs never expires, whatever its age (SPEC S3.6).
        floor = now_ms - self._retention_ms
        index_keys = [
            (key, key_floor)
            for partition in keys.partitions()
            for key, key_floor in (
                [(keys.runs(partition), "-inf")]
                if not statuses
                else [
                    (keys.runs_index(partition, status.value), floor if status.terminal else "-inf")
                    for status in statuses
                ]
            )
        ]
        wanted = set(statuses or JobStatus)
        jobs: list[JobView] = []
        position, last_shown = after, after
        while True:
            batch = limit + 1 - len(jobs)
            candidates, more = await self._candidates(index_keys, position, batch)
            views = await self._views([job_id for _, job_id in candidates])
            for (score, job_id), view in zip(candidates, views, strict=True):
                position = Position(score, job_id)
                if view is None or view.status not in wanted:
                    continue  # expired, or changed status since the index was read: it is listed elsewhere
                if len(jobs) == limit:
                    return Page(jobs, last_shown)  # one more exists below the last shown job
                jobs.append(view)
                last_shown = position
            if not more:
                return Page(jobs, None)

    async def _candidates(
        self, index_keys: list[tuple[str, int | str]], below: Position | None, count: int
    ) -> tuple[list[tuple[int, str]], bool]:
        """The next `count` entries below `below` over all `(index key, lowest score)`, merged; and whether more
        may follow."""
        # one snapshot of every index on a single Redis; a cluster reads each partition as it stands
        async with self._redis.pipeline(transaction=not is_cluster(self._redis)) as pipe:
            for key, floor in index_keys:
                if below is None:
                    pipe.zrange(key, "+inf", floor, desc=True, byscore=True, offset=0, num=count, withscores=True)
                else:  # the ties of the cursor's ms (few), then strictly lower scores
                    pipe.zrange(key, below.score, below.score, desc=True, byscore=True, withscores=True)
                    pipe.zrange(
                        key, f"({below.score}", floor, desc=True, byscore=True, offset=0, num=count, withscores=True
                    )
            replies = cast(list[list[tuple[str, float]]], await pipe.execute())
        merged: dict[str, int] = {}
        full = False
        for reply_index, reply in enumerate(replies):
            capped = below is None or reply_index % 2 == 1
            full = full or (capped and len(reply) >= count)
            for job_id, score in reply:
                entry = (int(score), job_id)
                if below is not None and entry >= (below.score, below.job_id):
                    continue
                merged[job_id] = max(merged.get(job_id, entry[0]), entry[0])
        ordered = sorted(((score, job_id) for job_id, score in merged.items()), reverse=True)
        return ordered[:count], full or len(ordered) > count

    async def _views(self, job_ids: list[str]) -> list[JobView | None]:
        return await lean.read_views(self._redis, job_ids) if job_ids else []


class IndexRepair:
    """Checks and repairs the listing indexes against the stored views (scripts/rebuild_projections.py)."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._reindex = redis.register_script(source("reindex_job"))

    async def job(self, view: JobView, last_id: str, *, write: bool) -> bool:
        """Whether the job's index entries differ from `view`, its fold up to `last_id` (`write`: repair)."""
        partition = keys.partition_of(view.job_id)
        status_keys = [keys.runs_index(partition, status.value) for status in JobStatus]
        target = keys.runs_index(partition, view.status.value)
        differs = await self._reindex(
            keys=[keys.view(view.job_id), keys.runs(partition), *status_keys],
            args=[view.job_id, view.updated_at_ms, target, "1" if write else "0", last_id],
        )
        return cast(int, differs) == 1

    async def dangling(self, *, write: bool) -> list[str]:
        """Jobs in the indexes that have no event stream any more (expired or deleted); removed with `write`."""
        found: dict[str, None] = {}
        every = [
            key
            for partition in keys.partitions()
            for key in [keys.runs(partition), *(keys.runs_index(partition, status.value) for status in JobStatus)]
        ]
        for key in every:
            async for job_id, _ in self._redis.zscan_iter(key, count=500):
                if not await self._redis.exists(keys.events(job_id)):
                    found[job_id] = None
                    if write:
                        await self._redis.zrem(key, job_id)
        return list(found)
