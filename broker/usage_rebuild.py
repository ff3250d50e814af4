"""The usage part of the projection rebuild (SPEC S4.5, S7): every key's hourly buckets recomputed from the streams.

Each job stream is folded with the same pure function the job writes use (`projections.usage.facts`), into the
hours retention still keeps in full (the streams of the facts of an older hour may have expired). A fact that a job
write left and no sweep has counted yet is left to the sweeps on both sides. `compare` is pure; with `write` each
hour that differs is replaced in one script, refused if a sweep counted a fact there that the rebuild did not read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterable

from attrs import define, field, frozen

from broker.store.jobs import JobStore
from broker.store.usage import HOUR_MS, ZERO, Counters, UsageStore, add, decode, hour_of
from projections.usage import FIELDS, Used, facts

HOUR_S = HOUR_MS // 1000


@define
class Recomputed:
    """What the streams say each hour holds: per key its counters, and the markers of the facts counted."""

    counters: dict[int, dict[str, Counters]] = field(factory=lambda: defaultdict(dict))
    markers: dict[int, set[str]] = field(factory=lambda: defaultdict(set))

    def add(self, used: Used) -> None:
        """Count `used` once (as the hour's markers do)."""
        hour = hour_of(used.at_ms)
        if used.marker in self.markers[hour]:
            return
        self.counters[hour][used.key] = add(self.counters[hour].get(used.key, ZERO), used.counts())
        self.markers[hour].add(used.marker)


@frozen
class UsageDifference:
    hour: int  #: the bucket's start, epoch seconds
    key: str
    stored: Counters
    rebuilt: Counters

    def line(self) -> dict[str, object]:
        return {
            "usage": {"hour": self.hour, "key": self.key},
            "differences": {
                "stored": dict(zip(FIELDS, self.stored, strict=True)),
                "rebuilt": dict(zip(FIELDS, self.rebuilt, strict=True)),
            },
        }


def first_hour(now_ms: int, retention_ms: int) -> int:
    """The oldest hour whose facts' streams are all still kept: the one after the hour retention reaches into."""
    return hour_of(now_ms - retention_ms) + HOUR_S


def compare(hours: list[int], stored: list[dict[str, Counters]], rebuilt: Recomputed) -> list[UsageDifference]:
    """Pure: the (hour, key) buckets whose stored counters are not the recomputed ones."""
    found: list[UsageDifference] = []
    for hour, held in zip(hours, stored, strict=True):
        want = rebuilt.counters.get(hour, {})
        for key in sorted(set(held) | set(want)):
            if held.get(key, ZERO) != want.get(key, ZERO):
                found.append(UsageDifference(hour, key, held.get(key, ZERO), want.get(key, ZERO)))
    return found


@frozen
class UsageOutcome:
    differences: list[UsageDifference]
    replaced: list[int]  #: hours replaced (with `write`)
    refused: list[int]  #: hours a sweep changed meanwhile (with `write`): run again


async def rebuild_usage(
    jobs: JobStore,
    usage: UsageStore,
    job_ids: AsyncIterable[str],
    *,
    now_ms: int,
    retention_ms: int,
    write: bool,
) -> UsageOutcome:
    first = first_hour(now_ms, retention_ms)
    hours = list(range(first, now_ms // 1000 + 1, HOUR_S))
    waiting = {item.member for item in await usage.pending(most=None) if item.used is not None}
    rebuilt = Recomputed()
    seen: set[str] = set()
    async for job_id in job_ids:
        if job_id in seen:
            continue
        seen.add(job_id)
        for used in facts(None, [event for _, event in await jobs.read(job_id)]):
            if hour_of(used.at_ms) >= first:
                rebuilt.add(used)
    await _leave_to_the_sweeps(usage, waiting, rebuilt)
    differences = compare(hours, await usage.hours(hours), rebuilt)
    replaced: list[int] = []
    refused: list[int] = []
    if write:
        for hour in sorted({difference.hour for difference in differences}):
            done = await usage.replace(hour, rebuilt.counters.get(hour, {}), sorted(rebuilt.markers.get(hour, ())))
            (replaced if done else refused).append(hour)
    return UsageOutcome(differences, replaced, refused)


async def _leave_to_the_sweeps(usage: UsageStore, waiting: set[str], rebuilt: Recomputed) -> None:
    """Take out of `rebuilt` the facts still waiting for a sweep that has not counted them: it will."""
    pending = [used for used in map(decode, waiting) if used is not None]
    for used, counted in zip(pending, await usage.seen(pending), strict=True):
        hour = hour_of(used.at_ms)
        if counted or used.marker not in rebuilt.markers.get(hour, ()):
            continue
        rebuilt.markers[hour].remove(used.marker)
        remaining = tuple(a - b for a, b in zip(rebuilt.counters[hour][used.key], used.counts(), strict=True))
        if remaining == ZERO:
            del rebuilt.counters[hour][used.key]
        else:
            rebuilt.counters[hour][used.key] = remaining
