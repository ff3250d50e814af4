"""Token budgets per fairness key (SPEC S4.4 `tokens` per `window`): the tokens each key's settled runs used, per hour,
in the `{quota}` slot, so that a pass reads every key's use in one round trip (one HMGET per key) and always fresh.

A run's tokens are added by whoever counts its usage fact (broker/store/usage.py: the usage sweep, or the replica
that releases the run, which counts its facts at once): the fact's marker is counted once per hour, and only the
counter that counted it adds its tokens here, so a run's tokens are added once. A crash between the two loses one
run's tokens from its key's budget (never from its usage).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

from redis.asyncio import Redis

from broker.admission.quotas import HOUR_MS, Quotas, budget_hours, budget_retry
from broker.store import keys
from projections.usage import Used

#: How long a key's per-hour tokens outlive its last run: past the longest window.
TOKENS_TTL_MS = 8 * 24 * HOUR_MS


class Budgets:
    def __init__(self, redis: Redis, quotas: Quotas) -> None:
        self._redis = redis
        self._quotas = quotas

    def applies(self, key: str) -> bool:
        return bool(self._quotas.of(key).tokens)

    async def counted(self, facts: Iterable[Used]) -> None:
        """Add the tokens of usage facts just counted (each by the one counter that counted it)."""
        spent = [used for used in facts if used.total_tokens and self.applies(used.key)]
        if not spent:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for used in spent:
                hour = used.at_ms // HOUR_MS * HOUR_MS // 1000
                pipe.hincrby(keys.quota_tokens(used.key), str(hour), used.total_tokens)
                pipe.pexpire(keys.quota_tokens(used.key), TOKENS_TTL_MS)
            await pipe.execute()

    async def use(self, chosen: Sequence[str], now_ms: int) -> dict[str, tuple[int, int]]:
        """Each budgeted key's (tokens used in its window, when it may start runs again: 0 while within its budget),
        in one round trip."""
        budgeted = [key for key in dict.fromkeys(chosen) if self.applies(key)]
        if not budgeted:
            return {}
        hours = {key: budget_hours(now_ms, cast(str, self._quotas.of(key).window)) for key in budgeted}
        async with self._redis.pipeline(transaction=False) as pipe:
            for key in budgeted:
                pipe.hmget(keys.quota_tokens(key), [str(hour) for hour in hours[key]])
            replies = cast(list[list[object]], await pipe.execute())
        found: dict[str, tuple[int, int]] = {}
        for key, reply in zip(budgeted, replies, strict=True):
            used = {hour: int(cast(str, n)) for hour, n in zip(hours[key], reply, strict=True) if n is not None}
            found[key] = (sum(used.values()), budget_retry(used, now_ms, self._quotas.of(key)) or 0)
        return found
