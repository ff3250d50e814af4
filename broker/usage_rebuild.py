"""The usage part of the projection rebuild (SPEC S4.5, S7): every key's hourly buckets recomputed from the streams.

Each job stream is folded with the same pure function the job writes use (`projections.usage.facts`), into the
hours retention still keeps in full (the streams of the facts of an older hour may have expired). The streams are
read first, then the facts still waiting for a sweep, then the stored buckets: a fact that waited may have been
counted by then or not, so a bucket matches when it holds the rest and any part of what waited. `compare` is pure;
with `write` each hour that differs is replaced in one script by what was counted for sure (what waited is left to
the sweeps), refused if a sweep counted a fact there that the rebuild did not know.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterable, Iterable

from attrs import define, field, frozen

from broker.store.jobs import JobStore
from broker.store.usage import HOUR_MS, ZERO, Counters, UsageStore, add, hour_of
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

    def without(self, waiting: Iterable[Used]) -> Recomputed:
        """The same without the facts of `waiting` that it holds (those a sweep may not have counted yet)."""
        rest = Recomputed()
        unique = {(hour_of(used.at_ms), used.marker): used for used in waiting}
        left = set(unique)
        for hour, markers in self.markers.items():
            rest.markers[hour] = {marker for marker in markers if (hour, marker) not in left}
            rest.counters[hour] = dict(self.counters[hour])
        for (hour, marker), used in unique.items():
            if marker in self.markers.get(hour, ()):
                held = rest.counters[hour].get(used.key, ZERO)
                rest.counters[hour][used.key] = tuple(a - b for a, b in zip(held, used.counts(), strict=True))
        return rest


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


def compare(
    hours: list[int], stored: list[dict[str, Counters]], counted: Recomputed, rebuilt: Recomputed
) -> list[UsageDifference]:
    """Pure: the (hour, key) buckets whose stored counters are neither what was counted for sure (`counted`) nor
    that plus some of what waited for a sweep (up to `rebuilt`, every fact of the streams)."""
    found: list[UsageDifference] = []
    for hour, held in zip(hours, stored, strict=True):
        low, high = counted.counters.get(hour, {}), rebuilt.counters.get(hour, {})
        for key in sorted(set(held) | set(high)):
            have, least, most = held.get(key, ZERO), low.get(key, ZERO), high.get(key, ZERO)
            if not all(a <= b <= c for a, b, c in zip(least, have, most, strict=True)):
                found.append(UsageDifference(hour, key, have, most))
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
    rebuilt = Recomputed()
    seen: set[str] = set()
    async for job_id in job_ids:
        if job_id in seen:
            continue
        seen.add(job_id)
        for used in facts(None, [event for _, event in await jobs.read(job_id)]):
            if hour_of(used.at_ms) >= first:
                rebuilt.add(used)
    # in this order: what waits now was written before (or is in no stream read), and is counted or not in what
    # is read next
    waiting = [item.used for item in await usage.pending(most=None) if item.used is not None]
    counted = rebuilt.without(waiting)
    differences = compare(hours, await usage.hours(hours), counted, rebuilt)
    replaced: list[int] = []
    refused: list[int] = []
    if write:
        for hour in sorted({difference.hour for difference in differences}):
            markers = sorted(counted.markers.get(hour, ()))
            done = await usage.replace(hour, _kept(counted.counters.get(hour, {})), markers)
            (replaced if done else refused).append(hour)
    return UsageOutcome(differences, replaced, refused)


def _kept(counters: dict[str, Counters]) -> dict[str, Counters]:
    return {key: values for key, values in counters.items() if values != ZERO}
