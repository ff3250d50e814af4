"""Quotas of live runs and token budgets in Redis (SPEC S4.4): the keys' live runs, and their jobs held out of the
line while they are at a limit.

Every fairness key's quota state is in the `{quota}` slot (broker/store/keys.py), so a pass takes the live runs of
every key it grants in one script (quota_take.lua): a key's live runs never pass its `live` quota however many
replicas grant at once. A granted job whose key is at its quota or over its budget is held: it waits in its key's
held zset at its place, out of the line, so passes do not read past it. A release of the key's run makes the key due
to be looked at; a replica's pass looks at the due keys (quota_wake.lua), which move the first held jobs they have
room for to their woken zset, and puts the woken jobs back in the line (broker/store/admission.py). A woken job
counts in the line, not as held; it stays woken until a pass takes or holds it, so a crash before it is back in the
line loses nothing (the next look returns it again). A key's jobs keep their order: a job that was never held waits
behind the key's held and woken ones of its priority, and a live run whose grant went back to the line (a refusal, a
hand-back) waits woken ahead of them (quota_return.lua).

A live entry expires LIVE_TTLS slot leases after its last renewal: a replica that froze or died keeps its run
counted until another replica takes the job over (which counts it again) or it plainly lapsed. Each replica remembers
the keys of the live runs it holds, so that releases and renewals need no read.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import cast

from attrs import frozen
from redis.asyncio import Redis

from broker.admission.quotas import Quotas
from broker.store import keys
from broker.store.budgets import Budgets
from broker.store.replies import text
from broker.store.scripts import Args, Scripts, run_many
from broker.store.usage import UsageStore
from projections.job import JobView

#: How often a key at its `live` quota is looked at without a release heard (a release lost with its replica: the
#: entry lapsed instead).
RECHECK_MS = 5_000
#: Most woken jobs a look returns to the line for a key (a budget that allows runs again: the rest next time).
RETURN_BATCH = 100
#: Most due keys one look takes.
WAKE_KEYS = 20
#: A live entry lapses this many slot leases (RUNS_LEASE) after its last renewal: past the takeover of a job whose
#: replica froze or died (its lease lapses after one, and the replica that takes it over counts it again).
LIVE_TTLS = 3
#: Most jobs a replica remembers as its keys' live runs (a memory bound: past it the oldest are forgotten, and their
#: entries lapse instead of being released).
MAX_REMEMBERED = 100_000


@frozen
class Taken:
    """What a pass's take decided: the jobs held, and those taken that had been held."""

    held: frozenset[str] = frozenset()
    waited: frozenset[str] = frozenset()


class QuotaStore:
    def __init__(self, redis: Redis, quotas: Quotas, usage: UsageStore | None = None) -> None:
        self.redis = redis  #: quota_view.py reads through it
        self.quotas = quotas
        self._usage = usage
        self.budgets = Budgets(redis, quotas)
        scripts = Scripts(redis)
        self._take = scripts.quota_take
        self._wake = scripts.quota_wake
        self._forget = scripts.quota_forget
        self._return = scripts.quota_return
        self._live: dict[str, str] = {}  #: job -> its key, for the live runs this replica counted or took over
        self._looked_at = -RECHECK_MS
        self.enforced = quotas.enforced()  #: a quota limits live runs or tokens: passes take and hold

    def applies(self, key: str) -> bool:
        quota = self.quotas.of(key)
        return bool(quota.live or quota.tokens)

    async def take(
        self, jobs: Sequence[tuple[str, str, str]], now_ms: int, ttl_ms: int, *, new: Collection[str] = ()
    ) -> Taken:
        """Count the (job, key, place) a pass grants as live runs of their keys, in order; the jobs held instead, and
        those taken that had been held (their wait for Hermes begins now). `new`: the jobs that are their keys' next,
        just charged their turns (a corrected turn may place one before its key's held jobs: quota_take.lua). Two
        round trips: the budgeted keys' use, and the script."""
        jobs = [job for job in jobs if self.applies(job[1])]
        if not jobs:
            return Taken()
        budgets = await self.budgets.use([key for _, key, _ in jobs], now_ms)
        index: dict[str, int] = {}
        script_keys = [keys.QUOTA_HELD_KEYS, keys.QUOTA_HOLDS, keys.QUOTA_HELD_COUNT, keys.QUOTA_RETURNED]
        lapse = LIVE_TTLS * ttl_ms
        args: list[str | int] = [now_ms, now_ms + lapse, now_ms + RECHECK_MS, 2 * lapse]
        for job_id, key, place in jobs:
            if key not in index:
                index[key] = len(index) + 1
                script_keys.extend((keys.quota_live(key), keys.quota_held(key), keys.quota_woken(key)))
            retry = budgets.get(key, (0, 0))[1]
            args.extend((index[key], key, job_id, self.quotas.of(key).live or 0, place, retry, int(job_id in new)))
        reply = cast(list[int], await self._take(keys=script_keys, args=args))
        held: set[str] = set()
        waited: set[str] = set()
        for (job_id, key, _), taken in zip(jobs, reply, strict=True):
            if int(taken) == 0:
                held.add(job_id)
                self._live.pop(job_id, None)
                continue
            self._remember(job_id, key)
            if int(taken) == 2:
                waited.add(job_id)
        return Taken(frozenset(held), frozenset(waited))

    async def wake(self, now_ms: int, *, every_ms: int = 200) -> list[tuple[str, str, str]]:
        """The held jobs whose keys have room again, as (job, key, place), to go back to the line (at most every
        `every_ms` unless a release or a forgotten job made a key due: a pass calls this each time). Two round trips
        however many keys are due: their budgets, and one script per key in one pipeline."""
        if not self.enforced or now_ms - self._looked_at < every_ms:
            return []
        self._looked_at = now_ms
        due = [text(key) for key in await self.redis.zrangebyscore(keys.QUOTA_HELD_KEYS, "-inf", now_ms, 0, WAKE_KEYS)]
        if not due:
            return []
        retry = {key: at for key, (_, at) in (await self.budgets.use(due, now_ms)).items()}
        calls: list[tuple[Sequence[str], Args]] = [
            (
                [
                    keys.QUOTA_HELD_KEYS,
                    keys.QUOTA_HOLDS,
                    keys.QUOTA_HELD_COUNT,
                    keys.quota_live(key),
                    keys.quota_held(key),
                    keys.quota_woken(key),
                ],
                [
                    key,
                    now_ms,
                    self.quotas.of(key).live or 0,
                    RETURN_BATCH,
                    now_ms + RECHECK_MS,
                    retry.get(key, 0),
                    1 if self.applies(key) else 0,
                ],
            )
            for key in due
        ]
        back: list[tuple[str, str, str]] = []
        for key, reply in zip(due, await run_many(self.redis, self._wake, calls), strict=True):
            items = [text(item) for item in cast(list[object], reply)]
            back.extend((job_id, key, place) for job_id, place in zip(items[::2], items[1::2], strict=True))
        return back

    async def forget(self, jobs: Sequence[tuple[str, str]]) -> None:
        """The (job, key) that finished or are gone while held or woken: off their keys' jobs, and the keys looked at
        again at once (their room goes to their next jobs)."""
        by_key: dict[str, list[str]] = {}
        for job_id, key in jobs:
            by_key.setdefault(key, []).append(job_id)
        for key, job_ids in by_key.items():
            forgotten = await self._forget(
                keys=[
                    keys.QUOTA_HELD_KEYS,
                    keys.QUOTA_HELD_COUNT,
                    keys.quota_held(key),
                    keys.quota_woken(key),
                    keys.QUOTA_RETURNED,
                ],
                args=[key, *job_ids],
            )
            if int(cast(int, forgotten)):
                self._looked_at = -RECHECK_MS

    async def release(self, job_id: str) -> None:
        """The job's run is no longer live: its key may start another (its held jobs are looked at next). A run of a
        key with a token budget has its usage counted first, so its tokens count before the key's next run starts."""
        key = self._live.get(job_id)
        if key is None:
            return
        if self.quotas.of(key).tokens and self._usage is not None:
            await self.budgets.counted(await self._usage.count_job(job_id))
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(keys.quota_live(key), job_id)
            pipe.zadd(keys.QUOTA_HELD_KEYS, {key: 0}, xx=True)
            await pipe.execute()
        self._live.pop(job_id, None)
        self._looked_at = -RECHECK_MS  # this replica's next pass looks at once

    async def returned(self, job_id: str, place: str, *, refused: bool) -> None:
        """The job's grant went back to the line at `place` before it ran (Hermes `refused` it, or it was handed
        back): no longer live, it waits woken ahead of its key's later jobs, which a corrected turn (SPEC S4.2) may
        have placed before them. Taken again, a refused job's wait for Hermes goes on (RUNS_HOLD counts Hermes's
        refusals); a handed-back one's begins again, as for a job its quota held."""
        key = self._live.pop(job_id, None)
        if key is None:
            return
        await self._return(
            keys=[
                keys.QUOTA_HELD_KEYS,
                keys.QUOTA_HOLDS,
                keys.quota_live(key),
                keys.quota_held(key),
                keys.quota_woken(key),
                keys.QUOTA_RETURNED,
            ],
            args=[key, job_id, place, "r" if refused else "h"],
        )
        self._looked_at = -RECHECK_MS  # this replica's next pass looks at once

    async def renew(self, job_ids: Iterable[str], now_ms: int, ttl_ms: int) -> None:
        """Keep the live entries of these jobs (their slots are renewed) from lapsing; an entry gone (another replica
        took the job over and released it) is forgotten here."""
        mine = [(job_id, self._live[job_id]) for job_id in job_ids if job_id in self._live]
        if not mine:
            return
        lapse = LIVE_TTLS * ttl_ms
        async with self.redis.pipeline(transaction=False) as pipe:
            for job_id, key in mine:
                pipe.zadd(keys.quota_live(key), {job_id: now_ms + lapse}, xx=True)
                pipe.zscore(keys.quota_live(key), job_id)
                pipe.pexpire(keys.quota_live(key), 2 * lapse)
            replies = await pipe.execute()
        for (job_id, _), score in zip(mine, replies[1::3], strict=True):
            if score is None:
                self._live.pop(job_id, None)

    async def hold(self, job_id: str, key: str, now_ms: int, ttl_ms: int) -> None:
        """Count a live run this replica took over (it runs on Hermes whatever the quota says)."""
        if not self.applies(key):
            return
        lapse = LIVE_TTLS * ttl_ms
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(keys.quota_live(key), {job_id: now_ms + lapse})
            pipe.pexpire(keys.quota_live(key), 2 * lapse)
            await pipe.execute()
        self._remember(job_id, key)

    async def is_held(self, view: JobView) -> bool:
        """Is the job held out of the line by its key's quota or budget (not woken)?"""
        key = view.scheduling.fairness_key
        return self.applies(key) and await self.redis.zscore(keys.quota_held(key), view.job_id) is not None

    def _remember(self, job_id: str, key: str) -> None:
        if len(self._live) >= MAX_REMEMBERED:
            del self._live[next(iter(self._live))]
        self._live[job_id] = key
