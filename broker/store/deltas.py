"""The delta schedules (SPEC S3.6): finished jobs whose `message.delta` entries are removed once
RUNS_DELTA_RETENTION has passed since they ended. The terminal job write schedules a job in its partition's
`hbr:{pN}:deltas`; every replica sweeps the schedules (never a SCAN) and runs remove_deltas.lua per due job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from redis.asyncio import Redis

from broker.store import keys, lean
from broker.store.scripts import Args, Scripts, run_many

BATCH = 50  #: due jobs taken per partition and sweep


class DeltaSchedule:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._scripts = Scripts(redis)

    async def due(self, now_ms: int) -> list[str]:
        """Jobs whose deltas are due for removal, up to BATCH per partition (one pipeline)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for partition in keys.partitions():
                pipe.zrange(keys.deltas(partition), "-inf", now_ms, byscore=True, offset=0, num=BATCH)
            replies = cast(list[list[str]], await pipe.execute())
        return [job_id for reply in replies for job_id in reply]

    async def remove(self, job_ids: list[str], now_ms: int) -> list[int]:
        """Remove the deltas of each due job (one script per job, in its slot; one pipeline): the entries
        removed per job, -1 for a job another replica took or that is not due. With the store's switch on, the
        view of each keeps its output only in the terminal entry from then on (broker/store/lean.py)."""
        states: list[str | None] = [None] * len(job_ids)
        if job_ids and await lean.allowed(self._redis):
            async with self._redis.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hget(keys.view(job_id), keys.VIEW_STATE)
                states = cast(list[str | None], await pipe.execute())
        calls: list[tuple[Sequence[str], Args]] = [
            (
                [
                    keys.events(job_id),
                    keys.view(job_id),
                    keys.deltas(keys.partition_of(job_id)),
                    keys.scratch(keys.partition_of(job_id)),
                ],
                [job_id, now_ms, *lean.lean_args(state)],
            )
            for job_id, state in zip(job_ids, states, strict=True)
        ]
        return [int(cast(int, reply)) for reply in await run_many(self._redis, self._scripts.remove_deltas, calls)]
