"""Token-owned run leases and the due schedules that make jobs survive their owner.

A driven job has a lease (`hbr:{pN}:J:lease`, PX = RUNS_LEASE) and an entry in its partition's due
schedule `hbr:{pN}:due` whose score is when any replica should look at it again. The owner pushes that
score out with every renewal; when the owner dies the score passes, `promote_due` takes the job and rings
the work doorbell for it, and the next replica to acquire the expired lease takes the job over.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import cast

from redis.asyncio import Redis

from broker.store import keys
from broker.store.durability import Durability
from broker.store.scripts import Args, Scripts, as_strings, ring_jobs, run_many


def new_token() -> str:
    return secrets.token_hex(12)


class Leases:
    def __init__(self, redis: Redis, *, lease_ms: int, durability: Durability | None = None) -> None:
        self._redis = redis
        self._scripts = Scripts(redis, durability)
        self.lease_ms = lease_ms

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
        calls: list[tuple[list[str], Args]] = [
            ([keys.lease(job_id), keys.due(keys.partition_of(job_id))], [token, self.lease_ms, job_id, deadline])
            for job_id, token in held
        ]
        return [cast(int, reply) == 1 for reply in await run_many(self._redis, self._scripts.renew_lease, calls)]

    async def release(self, job_id: str, token: str, *, due_at_ms: int | None, enqueue: bool = False) -> bool:
        """Give the job up; `due_at_ms=None` means it is finished and leaves the schedule."""
        released = await self._scripts.run(
            self._scripts.release_lease,
            keys=[keys.lease(job_id), keys.due(keys.partition_of(job_id))],
            args=[token, job_id, "" if due_at_ms is None else due_at_ms],
            ring={"job": job_id} if enqueue else None,
            durable=False,
        )
        return cast(int, released) == 1

    async def promote_due(self, now_ms: int, limit: int = 100) -> list[str]:
        """Take every job whose wake-up time has passed (atomically, once per lease) in every partition, and
        ring the work doorbell for them: one pipeline (one round trip per node)."""
        calls = [([keys.due(partition)], [now_ms, self.lease_ms, limit]) for partition in keys.partitions()]
        replies = await run_many(self._redis, self._scripts.promote_due, calls)
        promoted = [job_id for reply in replies for job_id in as_strings(reply)]
        if promoted:
            await ring_jobs(self._redis, promoted)
        return promoted
