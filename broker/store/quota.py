"""Quotas of live runs and token budgets in Redis (SPEC S4.4): the keys' live runs, and their jobs held out of the
line while they are at a limit.

Every fairness key's quota state is in the `{quota}` slot (broker/store/keys.py), so a pass takes the live runs of
every key it grants in one script (quota_take.lua): a key's live runs never pass its `live` quota however many
replicas grant at once. A granted job whose key is at its quota or over its budget is held: it waits in its key's
held zset at its place in the line, and is not in the line, so passes do not read past it. A release of the key's run
makes the key due to be looked at; a replica's pass looks at the due keys (quota_wake.lua) and puts the first jobs
they have room for back in the line, where they keep their places (the key's order: a later job of a key never passes
its earlier held ones).

A live entry expires with the job's admission slot (RUNS_LEASE; renewed with it): a replica that dies gives its keys'
quota back as it gives the slots back. Each replica remembers the keys of the live runs it holds, so that releases
and renewals need no read.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

from attrs import frozen
from redis.asyncio import Redis

from broker.admission.quotas import Bound, Quota, Quotas, budget_hours, budget_retry
from broker.events import HoldReason
from broker.store import keys
from broker.store.replies import text
from broker.store.scripts import Scripts
from broker.store.usage import UsageStore
from projections.job import Hold, JobView
from projections.usage import FIELDS

#: How often a key at its `live` quota is looked at without a release heard (a release lost with its replica: the
#: entry expired instead).
RECHECK_MS = 5_000
#: Most held jobs a look returns to the line for a key without a `live` quota (a budget that allows runs again).
RETURN_BATCH = 100
#: Most due keys one look takes.
WAKE_KEYS = 20
#: How long a key's token use as read is trusted (the usage sweep counts settled runs about once a second).
BUDGET_FRESH_MS = 1_000
_TOTAL = FIELDS.index("total_tokens")


@frozen
class Taken:
    """What a pass's take decided: the jobs held, and those taken that had been held."""

    held: frozenset[str] = frozenset()
    waited: frozenset[str] = frozenset()


@frozen
class KeyQuota:
    """One key's use of its quota (SPEC S4.4: /readyz, the console)."""

    key: str
    live: int
    held: int
    quota: Quota
    tokens_used: int | None = None  #: in the window, when the key has a token budget
    held_for: str | None = None  #: `quota` or `budget` while the key holds jobs
    retry_at_ms: int = 0  #: when a key over its budget starts runs again


class QuotaStore:
    def __init__(self, redis: Redis, quotas: Quotas, usage: UsageStore | None = None) -> None:
        self._redis = redis
        self.quotas = quotas
        self._usage = usage
        scripts = Scripts(redis)
        self._take = scripts.quota_take
        self._wake = scripts.quota_wake
        self._live: dict[str, str] = {}  #: job -> its key, for the live runs this replica counted or took over
        self._budgets: dict[str, tuple[int, int, int]] = {}  #: key -> (read at ms, retry at ms or 0, tokens used)
        self._looked_at = -RECHECK_MS
        self.enforced = quotas.enforced()  #: a quota limits live runs or tokens: passes take and hold

    def applies(self, key: str) -> bool:
        quota = self.quotas.of(key)
        return bool(quota.live or quota.tokens)

    async def take(self, jobs: Sequence[tuple[str, str, str]], now_ms: int, ttl_ms: int) -> Taken:
        """Count the (job, key, place) a pass grants as live runs of their keys, in order; the jobs held instead, and
        those taken that had been held (their wait for Hermes begins now)."""
        jobs = [job for job in jobs if self.applies(job[1])]
        if not jobs:
            return Taken()
        index: dict[str, int] = {}
        script_keys = [keys.QUOTA_HELD_KEYS, keys.QUOTA_HOLDS]
        args: list[str | int] = [now_ms, now_ms + ttl_ms, now_ms + RECHECK_MS]
        for job_id, key, place in jobs:
            if key not in index:
                index[key] = len(index) + 1
                script_keys.extend((keys.quota_live(key), keys.quota_held(key)))
            budget = await self._budget(key, now_ms)
            args.extend((index[key], key, job_id, self.quotas.of(key).live or 0, place, budget))
        reply = cast(list[int], await self._take(keys=script_keys, args=args))
        held: set[str] = set()
        waited: set[str] = set()
        for (job_id, key, _), taken in zip(jobs, reply, strict=True):
            if int(taken) == 0:
                held.add(job_id)
                continue
            self._live[job_id] = key
            if int(taken) == 2:
                waited.add(job_id)
        return Taken(frozenset(held), frozenset(waited))

    async def held(self, bound: Bound, key: str) -> tuple[int, int]:
        """Jobs held out of the line (of `key`, in all) that a create's waiting `bound` counts (SPEC S4.4: they wait):
        one round trip for the key's, two for all (the keys holding jobs, then their counts)."""
        if not self.enforced:
            return 0, 0
        mine = int(await self._redis.zcard(keys.quota_held(key))) if bound.key and self.applies(key) else 0
        if not bound.all:
            return mine, 0
        held_keys = [text(k) for k in await self._redis.zrange(keys.QUOTA_HELD_KEYS, 0, -1)]
        if not held_keys:
            return mine, 0
        async with self._redis.pipeline(transaction=False) as pipe:
            for held_key in held_keys:
                pipe.zcard(keys.quota_held(held_key))
            return mine, sum(int(n) for n in await pipe.execute())

    async def forget(self, jobs: Sequence[tuple[str, str]]) -> None:
        """The (job, key) finished while held: off their keys' held jobs."""
        jobs = [(job_id, key) for job_id, key in jobs if self.applies(key)]
        if not jobs:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id, key in jobs:
                pipe.zrem(keys.quota_held(key), job_id)
            await pipe.execute()

    async def wake(self, now_ms: int, *, every_ms: int = 200) -> list[tuple[str, str]]:
        """The held jobs whose keys have room again, as (job, place), to go back to the line (at most every
        `every_ms`: a pass calls this each time)."""
        if not self.enforced or now_ms - self._looked_at < every_ms:
            return []
        self._looked_at = now_ms
        due = [text(key) for key in await self._redis.zrangebyscore(keys.QUOTA_HELD_KEYS, "-inf", now_ms, 0, WAKE_KEYS)]
        back: list[tuple[str, str]] = []
        for key in due:
            quota = self.quotas.of(key)
            budget = await self._budget(key, now_ms, fresh=True)
            reply = await self._wake(
                keys=[keys.QUOTA_HELD_KEYS, keys.QUOTA_HOLDS, keys.quota_live(key), keys.quota_held(key)],
                args=[key, now_ms, quota.live or 0, RETURN_BATCH, now_ms + RECHECK_MS, budget],
            )
            items = [text(item) for item in cast(list[object], reply)]
            back.extend(zip(items[::2], items[1::2], strict=True))
        return back

    async def release(self, job_id: str) -> None:
        """The job's run is no longer live: its key may start another (its held jobs are looked at next)."""
        key = self._live.pop(job_id, None)
        if key is None:
            return
        if self.quotas.of(key).tokens and self._usage is not None:
            await self._usage.count_job(job_id)  # its tokens count before its key's next run is granted
            self._budgets.pop(key, None)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zrem(keys.quota_live(key), job_id)
            pipe.zadd(keys.QUOTA_HELD_KEYS, {key: 0}, xx=True)
            await pipe.execute()
        self._looked_at = -RECHECK_MS  # this replica's next pass looks at once

    async def renew(self, job_ids: Iterable[str], now_ms: int, ttl_ms: int) -> None:
        """Keep the live entries of these jobs (their slots are renewed) from expiring."""
        mine = [(job_id, self._live[job_id]) for job_id in job_ids if job_id in self._live]
        if not mine:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id, key in mine:
                pipe.zadd(keys.quota_live(key), {job_id: now_ms + ttl_ms}, xx=True)
            await pipe.execute()

    async def hold(self, job_id: str, key: str, now_ms: int, ttl_ms: int) -> None:
        """Count a live run this replica took over (it runs on Hermes whatever the quota says)."""
        if not self.applies(key):
            return
        await self._redis.zadd(keys.quota_live(key), {job_id: now_ms + ttl_ms})
        self._live[job_id] = key

    async def is_held(self, view: JobView) -> bool:
        """Is the job held out of the line by its key's quota or budget?"""
        key = view.scheduling.fairness_key
        return self.applies(key) and await self._redis.zscore(keys.quota_held(key), view.job_id) is not None

    async def holds(self, views: Sequence[JobView], now_ms: int) -> dict[str, Hold]:
        """The `quota` or `budget` hold of each of the views that is held (SPEC S3.2), in one round trip."""
        views = [view for view in views if self.applies(view.scheduling.fairness_key)]
        if not views:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for view in views:
                pipe.zscore(keys.quota_held(view.scheduling.fairness_key), view.job_id)
                pipe.hget(keys.QUOTA_HOLDS, view.scheduling.fairness_key)
            replies = await pipe.execute()
        shown: dict[str, Hold] = {}
        for view, place, why in zip(views, replies[::2], replies[1::2], strict=True):
            if place is not None:
                shown[view.job_id] = _hold(view, text(why) if why is not None else "quota", now_ms, self.quotas)
        return shown

    async def figures(self, now_ms: int, also: Iterable[str] = ()) -> list[KeyQuota]:
        """Each key's use of its quota: the keys named in ADMISSION_QUOTAS, those holding jobs, and `also` (the keys
        with most waiting jobs), nearest their limits first."""
        if not self.quotas:
            return []
        held_keys = [text(key) for key in await self._redis.zrange(keys.QUOTA_HELD_KEYS, 0, 49)]
        chosen = [key for key in dict.fromkeys([*(k for k, _ in self.quotas.keys), *held_keys, *also])]
        chosen = [key for key in chosen if self.quotas.of(key) != Quota()]
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in chosen:
                pipe.zcount(keys.quota_live(key), f"({now_ms}", "+inf")
                pipe.zcard(keys.quota_held(key))
                pipe.hget(keys.QUOTA_HOLDS, key)
            replies = await pipe.execute()
        found: list[KeyQuota] = []
        for number, key in enumerate(chosen):
            live, held, why = replies[3 * number : 3 * number + 3]
            quota = self.quotas.of(key)
            used = None
            if quota.tokens:
                await self._budget(key, now_ms)
                used = self._budgets[key][2]
            reason = None if not held or why is None else text(why)
            retry = int(reason.split(":", 1)[1]) if reason is not None and reason.startswith("budget:") else 0
            held_for = None if reason is None else reason.split(":", 1)[0]
            found.append(KeyQuota(key, int(live), int(held), quota, used, held_for, retry))
        return sorted(found, key=lambda figure: (-_nearness(figure), figure.key))

    async def _budget(self, key: str, now_ms: int, *, fresh: bool = False) -> int:
        """0 while the key is within its token budget, else when it allows runs again (epoch ms)."""
        quota = self.quotas.of(key)
        if not quota.tokens or quota.window is None or self._usage is None:
            return 0
        known = self._budgets.get(key)
        if known is not None and not fresh and now_ms - known[0] < BUDGET_FRESH_MS:
            return known[1]
        hours = budget_hours(now_ms, quota.window)
        used = dict(zip(hours, (counters[_TOTAL] for counters in await self._usage.buckets(key, hours)), strict=True))
        retry = budget_retry(used, now_ms, quota) or 0
        self._budgets[key] = (now_ms, retry, sum(used.values()))
        return retry


def _nearness(figure: KeyQuota) -> float:
    """How near its limits a key is (1: at one)."""
    quota, ratios = figure.quota, [1.0 if figure.held else 0.0]
    if quota.live:
        ratios.append(figure.live / quota.live)
    if quota.tokens and figure.tokens_used is not None:
        ratios.append(figure.tokens_used / quota.tokens)
    return max(ratios)


def _hold(view: JobView, why: str, now_ms: int, quotas: Quotas) -> Hold:
    key, quota = view.scheduling.fairness_key, quotas.of(view.scheduling.fairness_key)
    since = view.hold.since_ms if view.hold is not None else view.updated_at_ms
    if why.startswith("budget:"):
        retry = int(why.split(":", 1)[1])
        detail = f"Fairness key {key!r} used its {quota.tokens} tokens per {quota.window}; runs start again then."
        return Hold(HoldReason.BUDGET, since, max(retry, since), detail)
    detail = f"Fairness key {key!r} has {quota.live} live runs, its live quota."
    return Hold(HoldReason.QUOTA, since, max(now_ms, since), detail)
