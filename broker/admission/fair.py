"""Priority and fair shares in the admission line (SPEC S4.2): start-time fair queuing. Pure; no IO.

Every first attempt gets one number when it is created, its score in its partition's line, so the line stays a
sorted set per partition and a pass still merges the partitions' heads (DESIGN §6):

    score = BASE + (priority - 1) * BAND + S        S = max(F[priority, key], V[priority])

`S` is the job's virtual start tag, in units of 1/10,000 of a weight-1 turn; `F` is its fairness key's next turn
(the key's last start tag plus that job's advance, `10000 / weight` units, rounded, at least 1); `V` is the
virtual time of the priority, the tag a key without a turn ahead of it starts at. A key's jobs get increasing tags
(FIFO within a key; one key alone is plain arrival order), a key that arrives late starts at `V` (about one
round of the waiting keys), and two backlogged keys interleave in proportion to their weights.

A pass moves V (`moved`): past every tag it granted (jobs that arrive later go behind them), up to the smallest tag
still waiting (V follows the line: a key back from idle banks nothing), and past the latest jobs that entered at V
by what they cost (broker/admission/newcomers.py). The last is the self-clocking: keys without a turn are paced as
one more key, whose turn is V, so new one-job keys arriving as fast as slots free up take every other grant from a
backlogged key of weight 1, not all of them. Newcomers that arrive together (between two passes) still share a tag,
and a pass that reaches them orders them by arrival (`tied_at_cut`, `by_arrival`); those beyond the line's limit
move V no further, so a burst of new keys leaves the next newcomer no debt. Bands keep
priorities strict; everything below BASE sorts ahead of every band: resubmits (`created_ms`, ~1.8e12) and the
first attempts an older broker placed (`created_ms * 1000`, ~1.8e15).

Where the numbers live (broker/store): `F` per key and priority in the key's own partition (`turns`, written by
the job write on a single Redis, by fair_turn.lua before it on a cluster), `V` in the admission state (kept by
the grant, returned by every pass and cached per replica in `VirtualTimes`), a job's created ms (the tie-break)
in its partition's `arrivals`. All of it is below 2**53, so a double holds it exactly, in Lua too.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Mapping, Sequence

from attrs import define, field, frozen

from broker.admission.newcomers import Newcomers
from broker.config import Config
from broker.events import Scheduling

PRIORITIES = (1, 2, 3, 4, 5)
DEFAULT_PRIORITY = 3
UNIT = 10_000  #: a weight-1 job's turn, in tag units (a weight's rounding: at most weight / 20,000 off)
BASE = 2**51  #: the first band's score; below it: resubmits and the places an older broker gave
BAND = 2**50  #: one priority's room of tags (1e11 weight-1 turns; the 5 bands end below 2**53)
MAX_TAG = BAND - 1  #: tags saturate here rather than spill into the next priority
#: The largest advance of one job (a weight below UNIT / MAX_ADVANCE, about 1e-5, counts as that weight), so
#: a key of tiny weight cannot push the virtual time to the end of its band in a few jobs.
MAX_ADVANCE = 2**30
#: How often a replica that creates jobs re-reads V when no admission pass of its own brought it.
VIRTUAL_REFRESH_MS = 1_000
TOP_KEYS = 10


def advance(weight: float) -> int:
    """How far one job of `weight` moves its key's turn, in tag units (>= 1, <= MAX_ADVANCE)."""
    if weight <= UNIT / MAX_ADVANCE:
        return MAX_ADVANCE
    return max(1, min(MAX_ADVANCE, math.floor(UNIT / weight + 0.5)))


def start(turn: int | None, virtual: int, step: int) -> tuple[int, int]:
    """(the job's start tag, its key's next turn) from the key's turn (None: none kept) and V."""
    tag = min(max(turn or 0, virtual), MAX_TAG)
    return tag, min(tag + step, MAX_TAG)


def moved(virtual: int, granted: Sequence[int], waiting: int | None, newcomers: int | None) -> int:
    """V of a priority after a pass that granted first attempts of tags `granted` there: at least one past each tag
    granted, the smallest tag still waiting (`waiting`) and past the newcomers heard (`newcomers`: their tag plus
    what they cost, Newcomers.past); None: none known. V never goes back."""
    return min(max(virtual, waiting or 0, newcomers or 0, *(tag + 1 for tag in granted)), MAX_TAG)


def after_pass(
    virtual: Sequence[int],
    places: Iterable[float],
    waiting: Callable[[int], int | None],
    newcomers: Newcomers,
    room: int,
) -> dict[int, int]:
    """V of each priority a pass granted first attempts in (their `places` in the line), as `moved` gives it:
    `waiting(priority)` is the smallest tag still waiting there; `room` how many runs the line may have live
    (Newcomers.past)."""
    granted: dict[int, list[int]] = {}
    for place in places:
        found = band_of(place)
        if found is not None:
            granted.setdefault(found[0], []).append(found[1])
    return {
        priority: moved(virtual[priority - 1], tags, waiting(priority), newcomers.past(priority, room))
        for priority, tags in granted.items()
    }


def score(priority: int, tag: int) -> int:
    """A first attempt's score in its partition's line."""
    return BASE + (priority - 1) * BAND + tag


def band_of(place: float) -> tuple[int, int] | None:
    """(priority, tag) of a first attempt's score; None for a score ahead of the bands (resubmits, legacy)."""
    if place < BASE:
        return None
    offset = int(place) - BASE
    priority = min(offset // BAND + 1, PRIORITIES[-1])
    return priority, offset - (priority - 1) * BAND


def front(priority: int) -> int:
    """The front of a priority's band: where a first attempt goes back when its own score is lost."""
    return score(priority, 0)


class VirtualTimes:
    """V per priority as this replica last learnt it (from its passes, or read when stale): shared by the job
    store (creates read it) and the admission store (passes update it). A stale V only favours newcomers."""

    def __init__(self) -> None:
        self._tags = [0] * len(PRIORITIES)
        self._lined: list[int | None] = [None] * len(PRIORITIES)  #: V but for the newcomers' pacing (cost.lined)
        self.learnt_at_ms: int | None = None

    def tag(self, priority: int) -> int:
        return self._tags[priority - 1]

    def settling(self, priority: int) -> int:
        """The V a settle goes by (cost.settled): V as this replica's passes moved it but for the newcomers' pacing,
        when they did; else V."""
        lined = self._lined[priority - 1]
        return self._tags[priority - 1] if lined is None else min(self._tags[priority - 1], lined)

    def lined(self, tags: Mapping[int, int]) -> None:
        for priority, tag in tags.items():
            self._lined[priority - 1] = max(self._lined[priority - 1] or 0, tag)

    def learn(self, tags: Sequence[int], now_ms: int) -> None:
        self._tags = [max(old, new) for old, new in zip(self._tags, tags, strict=True)]
        self.learnt_at_ms = now_ms

    def stale(self, now_ms: int) -> bool:
        return self.learnt_at_ms is None or now_ms - self.learnt_at_ms >= VIRTUAL_REFRESH_MS


@frozen(kw_only=True)
class SchedulingRequest:
    """`scheduling` as a create gave it (validated; None: not given)."""

    priority: int | None = None
    fairness_key: str | None = None
    fairness_weight: float | None = None
    multitask: str | None = None


@frozen(kw_only=True)
class FairnessSettings:
    """S2 `ADMISSION_FAIRNESS_DEFAULT`, `ADMISSION_FAIRNESS_WEIGHTS` and `RUNS_SESSION_MULTITASK`."""

    default: str = "session_key"  #: session_key | session_id | none
    weights: Mapping[str, float] = field(factory=dict)
    multitask: str = "enqueue"  #: a turn's `scheduling.multitask` when its create gives none (SPEC S4.3)

    @classmethod
    def from_config(cls, config: Config) -> FairnessSettings:
        return cls(
            default=config.admission_fairness_default,
            weights=dict(config.admission_fairness_weights),
            multitask=config.runs_session_multitask,
        )


def resolve(
    request: SchedulingRequest, *, session_key: str | None, session_id: str | None, settings: FairnessSettings
) -> Scheduling:
    """A job's scheduling with the defaults filled in: the key from the create, else from the configured source;
    the configured weight of the key wins over the create's."""
    key = request.fairness_key
    if key is None:
        key = {"session_key": session_key, "session_id": session_id}.get(settings.default) or ""
    weight = settings.weights.get(key, request.fairness_weight if request.fairness_weight is not None else 1.0)
    priority = request.priority if request.priority is not None else DEFAULT_PRIORITY
    multitask = request.multitask or settings.multitask
    return Scheduling(priority=priority, fairness_key=key, fairness_weight=float(weight), multitask=multitask)


Head = tuple[float, str, int]  #: (score, job, partition) of a line's head, as a pass merges them


def tied_at_cut(merged: Sequence[Head], most: int) -> list[Head]:
    """The heads whose order a pass of `most` must learn from their arrival: those sharing a score with another of
    the heads it grants, or with the first one it leaves (one score: keys without a turn, between two grants)."""
    window = merged[: most + 1]
    shared = {score for score, *_ in window if sum(1 for other, *_ in window if other == score) > 1}
    return [head for head in merged if head[0] in shared]


def by_arrival(merged: Sequence[Head], arrived: Mapping[str, float | None]) -> list[Head]:
    """`merged` with the jobs of `arrived` (all of one score) in arrival order, unknown arrivals last, then by id."""
    return sorted(merged, key=lambda head: (head[0], _arrival(arrived, head[1]), head[1]))


def _arrival(arrived: Mapping[str, float | None], job_id: str) -> float:
    value = arrived.get(job_id)
    return math.inf if value is None else float(value)


@frozen
class KeyLoad:
    key: str
    waiting: int
    weight: float


def top_keys(counts: Iterable[tuple[str, int, float]], most: int = TOP_KEYS) -> list[KeyLoad]:
    """The keys with the most waiting jobs, from per-partition (key, count, weight) entries."""
    waiting: dict[str, int] = {}
    weights: dict[str, float] = {}
    for key, count, weight in counts:
        waiting[key] = waiting.get(key, 0) + count
        weights[key] = weight
    ranked = sorted(waiting.items(), key=lambda item: (-item[1], item[0]))[:most]
    return [KeyLoad(key, count, weights[key]) for key, count in ranked if count > 0]


@define
class FairLine:
    """A pure model of the partitioned line as the store keeps it, for property tests: turns per (priority, key),
    V per priority, one sorted line per partition, passes merging their heads, one replica's newcomers heard.
    `stale` creates may pass an older V (another replica's cache)."""

    partitions: int = 64
    turns: dict[tuple[int, str], int] = field(factory=dict)
    virtual: list[int] = field(factory=lambda: [0] * len(PRIORITIES))
    lines: dict[int, list[tuple[int, str]]] = field(factory=dict)
    arrived: dict[str, int] = field(factory=dict)  #: job -> arrival rank (the store: `arrivals`, created ms)
    newcomers: Newcomers = field(factory=lambda: Newcomers(len(PRIORITIES)))

    def enter(self, job_id: str, scheduling: Scheduling, partition: int, virtual: int | None = None) -> int:
        p, key = scheduling.priority, scheduling.fairness_key
        v = self.virtual[p - 1] if virtual is None else virtual
        step = advance(scheduling.fairness_weight)
        tag, turn = start(self.turns.get((p, key)), v, step)
        if tag == v:  # as the create's message (`new S A J`)
            self.newcomers.entered(p, tag, step)
        self.turns = {k: f for k, f in self.turns.items() if not (k[0] == p and f <= v)}  # as fair_turn.lua
        self.turns[(p, key)] = turn
        place = score(p, tag)
        heapq.heappush(self.lines.setdefault(partition % self.partitions, []), (place, job_id))
        self.arrived[job_id] = len(self.arrived)
        return place

    def resubmit(self, job_id: str, created_ms: int, partition: int) -> None:
        heapq.heappush(self.lines.setdefault(partition % self.partitions, []), (created_ms, job_id))

    def take(self, most: int) -> list[str]:
        """One pass: the `most` smallest heads over every partition (each line read `most` deep), merged."""
        merged = sorted(
            (float(place), job, 0) for line in self.lines.values() for place, job in heapq.nsmallest(most, line)
        )
        tied = tied_at_cut(merged, most)
        if tied:  # as admission_ties.lua: every job of that score, in every line
            others = [head for head in merged if head[0] != tied[0][0]]
            every = [(float(p), job, 0) for line in self.lines.values() for p, job in line if p == tied[0][0]]
            merged = by_arrival(others + every, {job: self.arrived.get(job) for _, job, _ in every})
        heads = [(int(place), job) for place, job, _ in merged[:most]]
        for place, job_id in heads:
            for line in self.lines.values():
                if (place, job_id) in line:
                    line.remove((place, job_id))
                    heapq.heapify(line)
                    break
        places = [place for place, _ in heads]
        passed = after_pass(
            self.virtual, places, lambda priority: smallest(self._places(), priority), self.newcomers, most
        )
        for priority, tag in passed.items():
            self.virtual[priority - 1] = tag
        return [job_id for _, job_id in heads]

    def waiting(self) -> int:
        return sum(len(line) for line in self.lines.values())

    def _places(self) -> Iterable[int]:
        return (place for line in self.lines.values() for place, _ in line)


def smallest(places: Iterable[float], priority: int) -> int | None:
    """The smallest tag of `priority` among the places of waiting jobs (None: none of that priority): a priority's
    places are the scores of its band (`band_of`), the last band open above."""
    low = score(priority, 0)
    high = score(priority + 1, 0) if priority < PRIORITIES[-1] else math.inf
    least = min((place for place in places if low <= place < high), default=None)
    return None if least is None else int(least) - low
