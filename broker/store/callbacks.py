"""Job callback deliveries in Redis (SPEC S5.8): the per-job hash, the per-partition due schedule, claims.

The job write (append_events.lua) owes deliveries with the transition that causes them; this module is what
the callback sender and the job object read and change afterwards. Each change is one script in the job's
partition slot. Jobs without a callback have no hash and are never in a schedule: they cost nothing here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Literal, cast

from attrs import frozen
from redis.asyncio import Redis

from broker.store import keys
from broker.store.scripts import as_strings, run_many, source

Outcome = Literal["delivered", "retry", "failed", "gone", "idle", "defer"]
_SHOWN = ("url", "status", "attempts", "last_error")


@frozen(kw_only=True)
class CallbackWrite:
    """What a job write owes the job's callback URL: `add` holds (webhook id, body) in order."""

    url: str
    add: tuple[tuple[str, bytes], ...]
    now_ms: int
    ttl_ms: int  #: how long the hash lives after the job's terminal write

    def fields(self, hash_index: int, due_index: int) -> dict[str, object]:
        """append_events.lua's `callback` field, given where its keys are in KEYS (1-based)."""
        return {
            "hash": str(hash_index),
            "due": str(due_index),
            "url": self.url,
            "now": str(self.now_ms),
            "ttl": str(self.ttl_ms),
            "add": [{"id": webhook_id, "body": body.decode()} for webhook_id, body in self.add],
        }

    def script_keys(self, job_id: str) -> list[str]:
        return [keys.callback(job_id), keys.callbacks_due(keys.partition_of(job_id))]


@frozen(kw_only=True)
class Owed:
    """The first delivery a job owes, as its hash holds it now."""

    job_id: str
    url: str
    webhook_id: str
    body: bytes
    owed_since_ms: int  #: when the job write owed it (the retry window runs from here)
    failures: int  #: failed attempts so far
    deferrals: int = 0  #: times it waited for a place at a receiver that had as many deliveries in flight as allowed


@frozen(kw_only=True)
class CallbackState:
    """What the job object shows of a job's callback (`status`: pending, delivered, failed or gone)."""

    url: str
    status: str = "pending"
    attempts: int = 0
    last_error: str | None = None

    def document(self) -> dict[str, object]:
        return {"url": self.url, "status": self.status, "attempts": self.attempts, "last_error": self.last_error}


class CallbackStore:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._claim = redis.register_script(source("callback_claim"))
        self._result = redis.register_script(source("callback_result"))

    async def claim(self, now_ms: int, lease_ms: int, limit: int) -> list[str]:
        """At most `limit` jobs whose next delivery is due, the soonest due first across the partitions, claimed
        for `lease_ms`: one pipeline reads what each partition has due, a second claims (a script per partition
        that has some of the soonest, each taking its own soonest, so never more than `limit` in all)."""
        partitions = list(keys.partitions())
        async with self._redis.pipeline(transaction=False) as pipe:
            for partition in partitions:
                pipe.zrangebyscore(keys.callbacks_due(partition), "-inf", now_ms, start=0, num=limit, withscores=True)
            peeked = cast(list[list[tuple[str, float]]], await pipe.execute())
        soonest = sorted((score, index) for index, due in enumerate(peeked) for _, score in due)[:limit]
        taken = Counter(index for _, index in soonest)
        if not taken:
            return []
        calls = [([keys.callbacks_due(partitions[index])], [now_ms, lease_ms, n]) for index, n in taken.items()]
        replies = await run_many(self._redis, self._claim, calls)
        return [job_id for reply in replies for job_id in as_strings(reply)]

    async def first_owed(self, job_id: str) -> Owed | None:
        """The head of the job's queue; None when it owes nothing (delivered, gone, expired)."""
        fields = cast(dict[str, str], await self._redis.hgetall(keys.callback(job_id)))
        queue = fields.get("queue", "").split()
        if not queue or f"b:{queue[0]}" not in fields:
            return None
        head = queue[0]
        return Owed(
            job_id=job_id,
            url=fields.get("url", ""),
            webhook_id=head,
            body=fields[f"b:{head}"].encode(),
            owed_since_ms=_number(fields.get(f"s:{head}")),
            failures=_number(fields.get(f"t:{head}")),
            deferrals=_number(fields.get(f"d:{head}")),
        )

    async def record(self, owed: Owed, outcome: Outcome, *, error: str = "", retry_at_ms: int = 0, now_ms: int) -> None:
        """Record one attempt's outcome and schedule the job's next delivery (callback_result.lua)."""
        script_keys = [keys.callback(owed.job_id), keys.callbacks_due(keys.partition_of(owed.job_id))]
        args: list[str | int] = [owed.job_id, owed.webhook_id, outcome, error, retry_at_ms, now_ms]
        await self._result(keys=script_keys, args=args)

    async def defer(self, owed: Owed, due_ms: int) -> None:
        """Make no attempt now: the job is due again at `due_ms`, its delivery counting one more deferral."""
        script_keys = [keys.callback(owed.job_id), keys.callbacks_due(keys.partition_of(owed.job_id))]
        await self._result(keys=script_keys, args=[owed.job_id, owed.webhook_id, "defer", "", due_ms, due_ms])

    async def idle(self, job_id: str, now_ms: int) -> None:
        """Take a job that owed nothing when read off the schedule, unless a write owed a delivery since."""
        script_keys = [keys.callback(job_id), keys.callbacks_due(keys.partition_of(job_id))]
        await self._result(keys=script_keys, args=[job_id, "", "idle", "", 0, now_ms])

    async def states(self, jobs: Sequence[tuple[str, str]]) -> dict[str, CallbackState]:
        """The callback state of each `(job id, callback url)`, in one pipeline; a job whose hash does not
        exist yet owes nothing so far: pending, no attempts."""
        if not jobs:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id, _ in jobs:
                pipe.hmget(keys.callback(job_id), list(_SHOWN))
            replies = cast(list[list[str | None]], await pipe.execute())
        states: dict[str, CallbackState] = {}
        for (job_id, url), (_, status, attempts, error) in zip(jobs, replies, strict=True):
            states[job_id] = CallbackState(
                url=url, status=status or "pending", attempts=_number(attempts), last_error=error or None
            )
        return states


def _number(value: str | None) -> int:
    return int(value) if value is not None and value.isdigit() else 0
