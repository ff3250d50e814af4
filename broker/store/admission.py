"""The admission line and slots in Redis (SPEC S4.1): grant, accept, refuse, release, renew, read.

The slots and the limit are one cluster-wide set in the `{adm}` slot (Hermes is one resource); the line is
per partition (`hbr:{pN}:line`, entered and left by the job write). A pass (`admit`):
  1. reserves up to n slots in `{adm}` (admission_admit.lua: the limit, probe pacing; a reservation counts
     against the limit but is no live run); none: done (one round trip at the limit);
  2. reads the heads of every partition's line (one pipeline, n each) and merges them oldest first;
  3. for each head in order, claims it (admission_claim.lua, the job's slot: off the line, its run lease
     taken, due for takeover) and gives it a reserved slot (admission_grant.lua); a head another replica
     took is skipped;
  4. gives the unused reservations back (admission_unreserve.lua).
A crash between steps loses nothing: a reservation expires by itself (RUNS_LEASE) and a claimed job is
due for takeover. A slot is keyed by its job: the job's run lease decides who holds it, its expiry
(renewed with the lease) returns a dead replica's slots within RUNS_LEASE.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from attrs import frozen
from redis.asyncio import Redis

from broker.admission.state import INITIAL_LIMIT, QUIET_MS, LineState, oldest_wait_ms
from broker.config import Config
from broker.events import HoldReason
from broker.store import keys
from broker.store.leases import new_token
from broker.store.scripts import Scripts

_REASONS = frozenset(reason.value for reason in HoldReason)
_KEYS = [keys.ADMISSION_STATE, keys.ADMISSION_LIVE, keys.ADMISSION_SLOTS]
_RESERVE_KEYS = [*_KEYS, keys.ADMISSION_RESERVED]


@frozen
class Grant:
    job_id: str
    token: str  #: the run lease taken with the grant


@frozen
class Grants:
    grants: list[Grant]  #: granted, oldest first, each with its run lease
    wake_at_ms: int | None  #: when a probe may go while Hermes refuses

    @property
    def jobs(self) -> list[str]:
        return [grant.job_id for grant in self.grants]


@frozen
class Refusal:
    retry_at_ms: int  #: the line's next probe
    began: bool  #: this refusal began a refusal streak
    limit: int
    limit_changed: bool


@frozen
class Acceptance:
    limit: int
    grew: bool
    ended_refusal: bool


@frozen(kw_only=True)
class Pacing:
    """How refusals are paced (S2 `RUNS_BACKOFF`/`RUNS_BACKOFF_MAX`) and whether the limit is pinned."""

    pinned: int = 0  #: HERMES_MAX_CONCURRENT; 0 = learnt
    slot_ttl_ms: int = 15_000  #: RUNS_LEASE
    backoff_ms: int = 1_000
    backoff_max_ms: int = 30_000
    quiet_ms: int = QUIET_MS

    @classmethod
    def from_config(cls, config: Config) -> Pacing:
        return cls(
            pinned=config.hermes_max_concurrent,
            slot_ttl_ms=config.runs_lease_ms,
            backoff_ms=config.runs_backoff_ms,
            backoff_max_ms=config.runs_backoff_max_ms,
        )


class AdmissionStore:
    def __init__(self, redis: Redis, pacing: Pacing) -> None:
        self._redis = redis
        self._scripts = Scripts(redis)
        self.pacing = pacing

    async def admit(self, now_ms: int, most: int) -> Grants:
        """Take up to `most` jobs off the heads of the lines, oldest first, each with a slot and its run
        lease, as far as the limit allows."""
        p = self.pacing
        reply = _ints_and_ids(
            await self._scripts.admission_admit(
                keys=_RESERVE_KEYS, args=[now_ms, most, p.slot_ttl_ms, p.pinned, INITIAL_LIMIT, new_token()]
            )
        )
        wake, reservations = int(reply[0]), reply[1:]
        if not reservations:
            return Grants([], wake or None)  # at the limit, or pacing a refusal: one round trip
        heads = await self._heads(len(reservations))
        grants: list[Grant] = []
        for job_id in heads:
            if len(grants) == len(reservations):
                break
            token, partition = new_token(), keys.partition_of(job_id)
            claimed = _ints_and_ids(
                await self._scripts.admission_claim(
                    keys=[keys.line(partition), keys.lease(job_id), keys.due(partition)],
                    args=[job_id, token, p.slot_ttl_ms, now_ms + p.slot_ttl_ms],
                )
            )
            if claimed[0] != "1":
                continue  # another replica took it (or drives it): the next head
            await self._scripts.admission_grant(
                keys=_RESERVE_KEYS, args=[reservations[len(grants)], job_id, claimed[1], now_ms, p.slot_ttl_ms]
            )
            grants.append(Grant(job_id, token))
        unused = reservations[len(grants) :]
        if unused:
            await self._scripts.admission_unreserve(keys=[keys.ADMISSION_STATE, keys.ADMISSION_RESERVED], args=unused)
        return Grants(grants, wake or None)

    async def _heads(self, most: int) -> list[str]:
        """The oldest `most` waiting jobs over every partition's line, oldest first."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for partition in keys.partitions():
                pipe.zrange(keys.line(partition), 0, most - 1, withscores=True)
            replies = await pipe.execute()
        merged = sorted((score, job_id) for reply in replies for job_id, score in cast(list[tuple[str, float]], reply))
        return [job_id for _, job_id in merged[:most]]

    async def accepted(self, job_id: str, now_ms: int) -> Acceptance:
        p = self.pacing
        reply = await self._scripts.admission_accepted(
            keys=[keys.ADMISSION_STATE, keys.ADMISSION_LIVE, keys.ADMISSION_SLOTS],
            args=[job_id, now_ms, p.pinned, p.quiet_ms, INITIAL_LIMIT, p.slot_ttl_ms],
        )
        limit, grew, ended = (int(x) for x in cast(list[int], reply))
        return Acceptance(limit, grew == 1, ended == 1)

    async def refused(
        self,
        job_id: str,
        now_ms: int,
        *,
        reason: HoldReason,
        detail: str,
        retry_after_ms: int | None,
        jitter: float,
        place: str,
    ) -> Refusal:
        """The job goes back to its place (`place` when its slot no longer knows it); the line learns."""
        p = self.pacing
        reply = await self._scripts.admission_refused(
            keys=_KEYS,
            args=[
                job_id,
                now_ms,
                reason.value,
                detail,
                "" if retry_after_ms is None else retry_after_ms,
                p.backoff_ms,
                p.backoff_max_ms,
                repr(jitter),
                p.pinned,
                "1" if reason is HoldReason.BUSY else "0",
                place,
                INITIAL_LIMIT,
            ],
        )
        retry_at, began, limit, changed, back = _ints_and_ids(reply)
        await self.enter(job_id, back)
        return Refusal(int(retry_at), began == "1", int(limit), changed == "1")

    async def release(self, job_id: str, *, freed: bool) -> bool:
        """Give the job's slot up; True when this ended a refusal (a settled run freed the slot)."""
        reply = await self._scripts.admission_release(
            keys=[keys.ADMISSION_STATE, keys.ADMISSION_LIVE, keys.ADMISSION_SLOTS],
            args=[job_id, "1" if freed else "0"],
        )
        return int(cast(list[int], reply)[1]) == 1

    async def requeue(self, job_id: str, place: str) -> None:
        back = await self._scripts.admission_requeue(keys=_KEYS, args=[job_id, place])
        await self.enter(job_id, back.decode() if isinstance(back, bytes) else str(back))

    async def hold(self, job_ids: Iterable[str], now_ms: int, *, renew_only: bool = False) -> None:
        """(Re)take the slots of live runs this replica drives: renewals (`renew_only`) and takeovers."""
        expiry = now_ms + self.pacing.slot_ttl_ms
        mapping: dict[str, float] = {job_id: expiry for job_id in job_ids}
        if mapping:
            await self._redis.zadd(keys.ADMISSION_LIVE, mapping, xx=renew_only)

    async def enter(self, job_id: str, place: str) -> None:
        """Make sure a waiting job is in the line (jobs of an older broker, or after a lost write)."""
        await self._redis.zadd(keys.line(keys.partition_of(job_id)), {job_id: float(place)}, nx=True)

    async def state(self, now_ms: int) -> LineState:
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys.ADMISSION_STATE)
            pipe.zcount(keys.ADMISSION_LIVE, f"({now_ms}", "+inf")
            for partition in keys.partitions():
                pipe.zcard(keys.line(partition))
                pipe.zrange(keys.line(partition), 0, 0, withscores=True)
            fields, live, *lines = await pipe.execute()
        s = cast(dict[str, str], fields)
        refusing = s.get("refusing", "")
        waiting = sum(int(count) for count in lines[::2])
        heads = sorted((score, job_id) for head in lines[1::2] for job_id, score in cast(list[tuple[str, float]], head))
        pinned = self.pacing.pinned
        return LineState(
            limit=pinned or int(s.get("limit") or INITIAL_LIMIT),
            learnt=pinned == 0,
            live=int(live),
            waiting=waiting,
            oldest_wait_ms=oldest_wait_ms(repr(heads[0][0]) if heads else None, now_ms),
            refusing=HoldReason(refusing) if refusing in _REASONS else None,
            detail=s.get("detail", ""),
            since_ms=int(s.get("since") or 0),
            retry_at_ms=int(s.get("retry_at") or 0),
            probes=int(s.get("probes") or 0),
            refused=int(s.get("refused") or 0),
        )


def _ints_and_ids(reply: object) -> list[str]:
    # redis-py types script replies loosely: a list of ints and bytes/str
    return [x.decode() if isinstance(x, bytes) else str(x) for x in cast(list[bytes | str | int], reply)]
