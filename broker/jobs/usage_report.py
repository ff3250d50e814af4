"""What GET /v1/usage and the console answer (SPEC S4.5): a key's buckets over a range, or the keys that used most.

The range is cut to whole hours and to what retention keeps (older buckets are gone), so a read costs at most one
command per retained hour of the range, and the top keys read only the keys that used Hermes in it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from attrs import frozen

from broker.store.usage import HOUR_MS, ZERO, Counters, UsageStore, add
from projections.usage import FIELDS

HOUR_S = HOUR_MS // 1000
DAY_S = 24 * HOUR_S
Bucket = Literal["hour", "day"]


@frozen(kw_only=True)
class Range:
    since_s: float
    until_s: float

    def hours(self, now_ms: int, retention_ms: int) -> list[int]:
        """The starts of the hours the range touches that retention still keeps, oldest first."""
        kept = (now_ms - retention_ms) // HOUR_MS * HOUR_S
        first = max(int(self.since_s) // HOUR_S * HOUR_S, kept)
        last = min(_ceil(self.until_s), now_ms // 1000 + HOUR_S)  # no bucket of the future has anything yet
        return list(range(first, last, HOUR_S))


def _ceil(seconds: float) -> int:
    whole = int(seconds)
    return whole if whole == seconds else whole + 1


def record(counters: Counters) -> dict[str, int | float]:
    """A bucket's counters as the API answers them (Hermes seconds, not ms)."""
    document: dict[str, int | float] = {}
    for name, value in zip(FIELDS, counters, strict=True):
        if name == "hermes_ms":
            document["hermes_seconds"] = round(value / 1000, 3)
        else:
            document[name] = value
    return document


async def key_buckets(store: UsageStore, key: str, hours: Sequence[int], bucket: Bucket) -> list[dict[str, object]]:
    """The key's buckets over `hours`, zeros included, oldest first (`day`: by UTC day)."""
    per_hour = await store.buckets(key, hours)
    if bucket == "hour":
        return [{"start": hour, **record(counters)} for hour, counters in zip(hours, per_hour, strict=True)]
    days: dict[int, Counters] = {}
    for hour, counters in zip(hours, per_hour, strict=True):
        day = hour // DAY_S * DAY_S
        days[day] = add(days.get(day, ZERO), counters)
    return [{"start": day, **record(counters)} for day, counters in days.items()]


@frozen
class KeyTotal:
    key: str
    counters: Counters

    @property
    def hermes_seconds(self) -> float:
        return self.counters[FIELDS.index("hermes_ms")] / 1000


async def top_keys(store: UsageStore, hours: Sequence[int], limit: int) -> list[KeyTotal]:
    """The `limit` keys with most Hermes time over `hours`, most first (ties by key), with their totals."""
    ranked = await store.ranked(hours)
    chosen = [key for key, _ in sorted(ranked.items(), key=lambda item: (-item[1], item[0]))[:limit]]
    totals = await store.totals(chosen, hours)
    return [KeyTotal(key, counters) for key, counters in zip(chosen, totals, strict=True)]
