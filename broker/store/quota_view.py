"""What callers and operators see of quotas (SPEC S4.4): a held job's hold, each key's use of its quota, and the held
jobs a create's waiting bound counts. Reads only (broker/store/quota.py writes)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from attrs import frozen

from broker.admission.quotas import Bound, Quota
from broker.events import HoldReason
from broker.store import keys
from broker.store.quota import QuotaStore
from broker.store.replies import text
from projections.job import Hold, JobView

#: Most keys holding jobs /readyz shows besides those ADMISSION_QUOTAS names and those with most waiting jobs.
SHOWN_HELD_KEYS = 50


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


async def holds(store: QuotaStore, views: Sequence[JobView], now_ms: int) -> dict[str, Hold]:
    """The `quota` or `budget` hold of each of the views that is held (SPEC S3.2), in one round trip."""
    views = [view for view in views if store.applies(view.scheduling.fairness_key)]
    if not views:
        return {}
    async with store.redis.pipeline(transaction=False) as pipe:
        for view in views:
            pipe.zscore(keys.quota_held(view.scheduling.fairness_key), view.job_id)
            pipe.hget(keys.QUOTA_HOLDS, view.scheduling.fairness_key)
        replies = await pipe.execute()
    shown: dict[str, Hold] = {}
    for view, place, why in zip(views, replies[::2], replies[1::2], strict=True):
        if place is not None:
            shown[view.job_id] = _hold(view, text(why) if why is not None else "quota", now_ms, store.quotas.of)
    return shown


async def held(store: QuotaStore, bound: Bound, key: str) -> tuple[int, int]:
    """Jobs held out of the line (of `key`, in all) that a create's waiting `bound` counts (they wait): one round
    trip."""
    if not store.enforced or not bound:
        return 0, 0
    async with store.redis.pipeline(transaction=False) as pipe:
        pipe.zcard(keys.quota_held(key))
        pipe.get(keys.QUOTA_HELD_COUNT)
        mine, every = await pipe.execute()
    return (int(mine) if bound.key else 0), (max(0, int(every or 0)) if bound.all else 0)


async def figures(store: QuotaStore, now_ms: int, also: Iterable[str] = ()) -> list[KeyQuota]:
    """Each key's use of its quota: the keys named in ADMISSION_QUOTAS, those holding jobs, and `also` (the keys
    with most waiting jobs), nearest their limits first. Three round trips however many keys."""
    if not store.quotas:
        return []
    held_keys = [text(key) for key in await store.redis.zrange(keys.QUOTA_HELD_KEYS, 0, SHOWN_HELD_KEYS - 1)]
    chosen = list(dict.fromkeys([*(key for key, _ in store.quotas.keys), *held_keys, *also]))
    chosen = [key for key in chosen if store.quotas.of(key) != Quota()]
    async with store.redis.pipeline(transaction=False) as pipe:
        for key in chosen:
            pipe.zcount(keys.quota_live(key), f"({now_ms}", "+inf")
            pipe.zcard(keys.quota_held(key))
            pipe.hget(keys.QUOTA_HOLDS, key)
        replies = await pipe.execute()
    budgets = await store.budgets.use(chosen, now_ms)
    found: list[KeyQuota] = []
    for number, key in enumerate(chosen):
        live, held_now, why = replies[3 * number : 3 * number + 3]
        reason = text(why) if held_now and why is not None else None
        retry = int(reason.split(":", 1)[1]) if reason is not None and reason.startswith("budget:") else 0
        used = budgets[key][0] if key in budgets else None
        held_for = None if reason is None else reason.split(":", 1)[0]
        found.append(KeyQuota(key, int(live), int(held_now), store.quotas.of(key), used, held_for, retry))
    return sorted(found, key=lambda figure: (-_nearness(figure), figure.key))


def _nearness(figure: KeyQuota) -> float:
    """How near its limits a key is (1: at one)."""
    quota, ratios = figure.quota, [1.0 if figure.held else 0.0]
    if quota.live:
        ratios.append(figure.live / quota.live)
    if quota.tokens and figure.tokens_used is not None:
        ratios.append(figure.tokens_used / quota.tokens)
    return max(ratios)


def _hold(view: JobView, why: str, now_ms: int, quota_of: Callable[[str], Quota]) -> Hold:
    key = view.scheduling.fairness_key
    quota = quota_of(key)
    since = view.hold.since_ms if view.hold is not None else view.updated_at_ms
    if why.startswith("budget:"):
        retry = int(why.split(":", 1)[1])
        detail = f"Fairness key {key!r} used its {quota.tokens} tokens per {quota.window}; runs start again then."
        return Hold(HoldReason.BUDGET, since, max(retry, since), detail)
    if why == "quota" and quota.live:
        detail = f"Fairness key {key!r} has {quota.live} live runs, its live quota."
        return Hold(HoldReason.QUOTA, since, max(now_ms, since), detail)
    # behind the key's earlier jobs, which its live quota (or, without one, its budget) held
    reason = HoldReason.QUOTA if quota.live else HoldReason.BUDGET
    detail = f"Fairness key {key!r} has earlier jobs its {reason.value} held; this one follows them."
    return Hold(reason, since, max(now_ms, since), detail)
