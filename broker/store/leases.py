"""Token-owned run leases and the due schedule that makes jobs survive their owner.

A driven job has a lease (`hbr:{J}:lease`, PX = RUNS_LEASE) and an entry in `hbr:due` whose
score is when any replica should look at it again. The owner pushes that score out with every
renewal; when the owner dies the score passes, `promote` puts the job on the work stream, and
the next replica to acquire the expired lease takes the job over.
"""

from __future__ import annotations

import secrets
from typing import cast

from redis.asyncio import Redis

from broker.store import keys
from broker.store.scripts import Scripts, as_strings


def new_token() -> str:
    return secrets.token_hex(12)


class Leases:
    def __init__(self, redis: Redis, *, lease_ms: int) -> None:
        self._redis = redis
        self._scripts = Scripts(redis)
        self.lease_ms = lease_ms

    async def acquire(self, job_id: str, token: str, now_ms: int) -> bool:
        acquired = await self._scripts.acquire_lease(
            keys=[keys.lease(job_id), keys.DUE], args=[token, self.lease_ms, job_id, now_ms + self.lease_ms]
        )
        return cast(int, acquired) == 1

    async def renew(self, job_id: str, token: str, now_ms: int) -> bool:
        renewed = await self._scripts.renew_lease(
            keys=[keys.lease(job_id), keys.DUE], args=[token, self.lease_ms, job_id, now_ms + self.lease_ms]
        )
        return cast(int, renewed) == 1

    async def release(self, job_id: str, token: str, *, due_at_ms: int | None, enqueue: bool = False) -> bool:
        """Give the job up; `due_at_ms=None` means it is finished and leaves the schedule."""
        released = await self._scripts.release_lease(
            keys=[keys.lease(job_id), keys.DUE, keys.WORK],
            args=[token, job_id, "" if due_at_ms is None else due_at_ms, "1" if enqueue else "0"],
        )
        return cast(int, released) == 1

    async def promote_due(self, now_ms: int, limit: int = 100) -> list[str]:
        """Put every job whose wake-up time has passed on the work stream (atomically, once)."""
        promoted = await self._scripts.promote_due(keys=[keys.DUE, keys.WORK], args=[now_ms, self.lease_ms, limit])
        return as_strings(promoted)
