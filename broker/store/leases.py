"""Token-owned run leases and the due schedules that make jobs survive their owner.

A driven job has a lease (`hbr:{pN}:J:lease`, PX = RUNS_LEASE) and an entry in its partition's due
schedule `hbr:{pN}:due` whose score is when any replica should look at it again. The owner pushes that
score out with every renewal; when the owner dies the score passes, `promote_due` takes the job and rings
the work doorbell for it, and the next replica to acquire the expired lease takes the job over.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import cast

from redis.asyncio import Redis
from redis.client import NEVER_DECODE

from broker.store import keys
from broker.store.durability import Durability
from broker.store.scripts import Args, Scripts, as_strings, ring_jobs, run_many

#: At most this many leases released by terminal writes are remembered until their owners release them.
MAX_ENDED = 10_000


#: Between the replica id and the random part of a lease token (no host name holds it).
_OWNER_END = "/"


def new_token(replica: str = "") -> str:
    """A lease token; it names the replica that takes the lease (SPEC S3.2 `owner`). Holders compare tokens
    whole, so a replica of an earlier broker (a bare random token) and this one share the leases."""
    random = secrets.token_hex(12)
    return f"{replica}{_OWNER_END}{random}" if replica else random


def owner_of(token: str | None) -> str | None:
    """The replica a lease token names; None for no lease, or one of an earlier broker's that names none."""
    if not token:
        return None
    return token.rpartition(_OWNER_END)[0] or None


async def owners(redis: Redis, job_ids: Sequence[str]) -> list[str | None]:
    """The replica driving each job (its run lease's), in one pipeline: one GET per job. Read as bytes: a value that
    is not UTF-8 (written by hand) shows with its undecodable bytes replaced, never fails the read."""
    if not job_ids:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.execute_command("GET", keys.lease(job_id), **{NEVER_DECODE: True})
        tokens = await pipe.execute()
    return [owner_of(None if token is None else _text(token)) for token in tokens]


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


class Leases:
    def __init__(self, redis: Redis, *, lease_ms: int, durability: Durability | None = None) -> None:
        self._redis = redis
        self._scripts = Scripts(redis, durability)
        self.lease_ms = lease_ms
        #: (job, token) of leases the job's terminal write released (append_events.lua `release`), until the
        #: owner's release: renewing them reports them held, releasing them costs no round trip
        self._ended: set[tuple[str, str]] = set()
        #: (job, token) -> how many of the job's fenced writes are on their way: one may end the job and release the
        #: lease in Redis before its reply is read, so a renewal that finds the lease gone meanwhile is not a loss
        self._writing: dict[tuple[str, str], int] = {}

    @contextmanager
    def writing(self, job_id: str, token: str) -> Iterator[None]:
        """The job's owner is making a write fenced by `token` that may end the job (and release its lease): while
        it is on its way, a renewal that finds the lease gone reports it held. A lease another replica took is
        found by the write itself, which its fence refuses."""
        lease = (job_id, token)
        self._writing[lease] = self._writing.get(lease, 0) + 1
        try:
            yield
        finally:
            left = self._writing.pop(lease) - 1
            if left:
                self._writing[lease] = left

    def released(self, job_id: str, token: str) -> None:
        """The job's terminal write released `token`'s lease (and took the job off the due schedule)."""
        if len(self._ended) >= MAX_ENDED:  # owners that never released (a drain): forget them
            self._ended.clear()
        self._ended.add((job_id, token))

    def forget(self, job_id: str, token: str) -> None:
        """The owner is done with a lease it found gone: released by its job's terminal write, or taken."""
        self._ended.discard((job_id, token))

    async def holder(self, job_id: str) -> str | None:
        """The token that holds the job's lease (None: nobody); a read, answered by a Redis that takes no writes."""
        value = await self._redis.get(keys.lease(job_id))
        return None if value is None else _text(value)

    async def acquire(self, job_id: str, token: str, now_ms: int) -> bool:
        acquired = await self._scripts.acquire_lease(
            keys=[keys.lease(job_id), keys.due(keys.partition_of(job_id))],
            args=[token, self.lease_ms, job_id, now_ms + self.lease_ms],
        )
        return cast(int, acquired) == 1

    async def renew(self, job_id: str, token: str, now_ms: int) -> bool:
        renewed = await self._scripts.renew_lease(
            keys=[keys.lease(job_id), keys.due(keys.partition_of(job_id))],
            args=[token, self.lease_ms, job_id, now_ms + self.lease_ms],
        )
        return cast(int, renewed) == 1

    async def renew_many(self, held: Sequence[tuple[str, str]], now_ms: int) -> list[bool]:
        """Renew every (job, token) lease of a replica in one pipeline (one round trip per node); True for
        each lease still held."""
        deadline = now_ms + self.lease_ms
        live = [lease for lease in held if lease not in self._ended]  # an ended job's runner is finishing
        calls: list[tuple[list[str], Args]] = [
            ([keys.lease(job_id), keys.due(keys.partition_of(job_id))], [token, self.lease_ms, job_id, deadline])
            for job_id, token in live
        ]
        renewed = dict(zip(live, await run_many(self._redis, self._scripts.renew_lease, calls), strict=True))
        # read after the replies: a write that ended the job meanwhile released the lease before this renewal ran
        return [
            lease not in renewed or cast(int, renewed[lease]) == 1 or lease in self._ended or lease in self._writing
            for lease in held
        ]

    async def release(self, job_id: str, token: str, *, due_at_ms: int | None, enqueue: bool = False) -> bool:
        """Give the job up; `due_at_ms=None` means it is finished and leaves the schedule."""
        if (job_id, token) in self._ended:  # its terminal write released it already; the job is done
            self._ended.discard((job_id, token))
            return True
        released = await self._scripts.run(
            self._scripts.release_lease,
            keys=[keys.lease(job_id), keys.due(keys.partition_of(job_id))],
            args=[token, job_id, "" if due_at_ms is None else due_at_ms],
            ring={"job": job_id} if enqueue else None,
            durable=False,
        )
        return cast(int, released) == 1

    async def wake(self, job_id: str, at_ms: int) -> None:
        """Make the job due at `at_ms`, whoever holds it: a job whose end released its lease and schedule entry, but
        that a runner is to look at again (SPEC S4.3: a turn whose create answer was lost keeps its session)."""
        await self._redis.zadd(keys.due(keys.partition_of(job_id)), {job_id: at_ms})

    async def promote_due(self, now_ms: int, limit: int = 100) -> list[str]:
        """Take every job whose wake-up time has passed (atomically, once per lease) in every partition, and
        ring the work doorbell for them. A pipeline first looks for one due job per partition (one round trip per
        node; mostly none is); promote_due.lua runs only where one was found, and takes them atomically there (a job
        another replica took in between is not due any more: it takes none)."""
        partitions = list(keys.partitions())
        async with self._redis.pipeline(transaction=False) as pipe:
            for partition in partitions:
                pipe.zrangebyscore(keys.due(partition), "-inf", now_ms, start=0, num=1)
            found = cast(list[list[object]], await pipe.execute())
        due = [partition for partition, first in zip(partitions, found, strict=True) if first]
        if not due:
            return []
        calls = [([keys.due(partition)], [now_ms, self.lease_ms, limit]) for partition in due]
        replies = await run_many(self._redis, self._scripts.promote_due, calls)
        promoted = [job_id for reply in replies for job_id in as_strings(reply)]
        if promoted:
            await ring_jobs(self._redis, promoted)
        return promoted
