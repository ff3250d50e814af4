"""The delta schedules (SPEC S3.6): finished jobs whose `message.delta` entries are removed once
RUNS_DELTA_RETENTION has passed since they ended. The terminal job write schedules a job in its partition's
`hbr:{pN}:deltas`; every replica sweeps the schedules (never a SCAN) and runs remove_deltas.lua per due job, in
bounded slices (a job stays due until its last slice).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from redis.asyncio import Redis

from broker.store import keys, lean
from broker.store.scripts import Args, Scripts, run_many

BATCH = 50  #: due jobs taken per partition and sweep
#: Entries one remove_deltas.lua call reads: well under a millisecond of Redis (about 0.4 ms at 250 entries).
SLICE = 250
ROUND = 16  #: calls in one pipeline (Redis runs a pipeline's calls back to back)
#: Calls per job and sweep (a later sweep carries on): a stream of RUNS_EVENTS_MAXLEN entries needs 401.
MAX_CALLS = 100_000 // SLICE + 8
MORE = -2  #: remove_deltas.lua's answer when more slices follow


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
        """Remove the deltas of each due job, SLICE entries per call (remove_deltas.lua, in the job's slot), calls of
        several jobs ROUND to a pipeline, until each job is done (or MAX_CALLS calls each: a later sweep carries
        on): the entries removed per job, -1 for a job another replica took or that is not due, -2 for one left
        part-way. With the store's switch on, the view of each keeps its output only in the terminal entry from
        then on (broker/store/lean.py)."""
        states: list[str | None] = [None] * len(job_ids)
        if job_ids and await lean.allowed(self._redis):
            async with self._redis.pipeline(transaction=False) as pipe:
                for job_id in job_ids:
                    pipe.hget(keys.view(job_id), keys.VIEW_STATE)
                states = cast(list[str | None], await pipe.execute())
        calls = [_call(job_id, now_ms, state) for job_id, state in zip(job_ids, states, strict=True)]
        results = [MORE] * len(job_ids)
        todo = list(range(len(job_ids)))
        for _ in range(MAX_CALLS):
            if not todo:
                break
            for start in range(0, len(todo), ROUND):
                chunk = todo[start : start + ROUND]
                replies = await run_many(self._redis, self._scripts.remove_deltas, [calls[i] for i in chunk])
                for index, reply in zip(chunk, replies, strict=True):
                    results[index] = int(cast(int, reply))
            todo = [index for index in todo if results[index] == MORE]
        return results


def _call(job_id: str, now_ms: int, state: str | None) -> tuple[Sequence[str], Args]:
    partition = keys.partition_of(job_id)
    return (
        [keys.events(job_id), keys.view(job_id), keys.deltas(partition), keys.compact(job_id)],
        [job_id, now_ms, *lean.lean_args(state), SLICE],
    )
