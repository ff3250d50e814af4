"""What a turn costs (SPEC S4.2, `ADMISSION_FAIRNESS_COST`): cost-aware fair shares, lazily tagged. Pure; no IO.

Start-time fair queuing with tags fixed at create (broker/admission/fair.py) cannot charge what a run really cost:
a correction at the settle only reaches jobs created after it, so a backlog created at once is shared by job count.
Here a key's jobs are tagged one at a time, when they reach the front of their key (as the per-flow queues of
Kubernetes API Priority and Fairness): each key has at most one job per priority in the line, its **front**, at the
key's start tag `max(F, V)`; its other waiting first attempts are **parked** beside the line, in arrival order. A
grant charges the key an estimate (`F = max(F, V) + estimate / weight`) and puts its next job in the line at the new
`max(F, V)`; the settle corrects F by what the run measured minus the estimate (either way: a key whose runs were
shorter than charged gets the difference back, of a charge of the guess down to one turn behind V: no banked
credit).

The numbers are fair.py's (a score is `BASE + (priority - 1) * BAND + tag`; V per priority) with another unit:
`time` charges the slot milliseconds divided by the weight, `tokens` the run's `usage.total_tokens` divided by the
weight, `runs` fair.UNIT per job (exactly fair.advance: the S4.2 behaviour before costs). Each function below is what
one store script computes, in one slot:

    enter    (fair_turn.lua, at create, the key's partition)      the job joins its key's queue: the front or parked
    granted  (fair_next.lua, at grant, the key's partition)       charge the estimate, the key's next job is the front
    settled  (fair_settle.lua, at settle, the key's partition)    correct F by measured - estimate; learn the cost
    left     (fair_next.lua too, a waiting job stopped)           the next job is the front, nothing charged

and `choose` is the pass's decision over the heads it merged. broker/admission/cost_line.py models the whole line
(partitions, slots, runs, settles, replicas' crashes) with these functions; broker/store/cost_store.py says how the
store wires them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from enum import StrEnum

from attrs import evolve, frozen

from broker.admission import fair, newcomers
from broker.config import Config

GUESS = 60_000  #: ADMISSION_FAIRNESS_GUESS's default: a key without history is charged 60 s of slot time
#: The estimate is the average of the key's latest runs: exact for its first HISTORY, then each new run weighs
#: 1/HISTORY (an exponential average: two numbers per key in the store, no list).
HISTORY = 8
#: How much of a job's charge its settle may take back, at most: a run is charged at least one tag unit, so a key's
#: next tag is always past its last one (FIFO within a key, whatever the corrections).
FLOOR = 1
MAX_TAG = fair.MAX_TAG


class CostMode(StrEnum):
    TIME = "time"  #: the Hermes slot time of the run (accepted -> settled), ms
    TOKENS = "tokens"  #: the run's usage.total_tokens
    RUNS = "runs"  #: one unit per job (fair.UNIT tag units at weight 1)


@frozen
class CostSettings:
    """SPEC S2 `ADMISSION_FAIRNESS_COST` and `ADMISSION_FAIRNESS_GUESS` (in the mode's unit: ms, or tokens)."""

    mode: CostMode = CostMode.TIME
    guess: int = GUESS

    @classmethod
    def from_config(cls, config: Config) -> CostSettings:
        return cls(CostMode(config.admission_fairness_cost), config.admission_fairness_guess)


def charge(cost: float, weight: float) -> int:
    """Tag units of a run that cost `cost` (the mode's unit) to a key of `weight`: cost / weight, rounded, at least
    FLOOR and at most fair.MAX_ADVANCE (as fair.advance, which is charge(fair.UNIT, weight))."""
    if weight <= 0 or cost / weight >= fair.MAX_ADVANCE:
        return fair.MAX_ADVANCE
    return max(FLOOR, min(fair.MAX_ADVANCE, math.floor(cost / weight + 0.5)))


@frozen
class History:
    """A key's recent settled costs (the store: `avg` and `n` in the key's cost hash, in the key's partition)."""

    average: float = 0.0
    runs: int = 0

    def settled(self, cost: float) -> History:
        n = min(self.runs + 1, HISTORY)
        return History(self.average + (cost - self.average) / n, self.runs + 1)

    def estimate(self, settings: CostSettings) -> float:
        """What the key's next run is expected to cost (the mode's unit): its average, or the guess."""
        if settings.mode is CostMode.RUNS:
            return float(fair.UNIT)
        return self.average if self.runs else float(settings.guess)


def estimate(history: History, settings: CostSettings, weight: float) -> int:
    """A key's next grant's charge, in tag units."""
    return charge(history.estimate(settings), weight)


def measured(settings: CostSettings, hermes_ms: int | None, total_tokens: int | None) -> float | None:
    """What a settled run cost, from its settling usage fact (projections/usage.py: `hermes_ms`, and `total_tokens`
    of a completed run); None: nothing measured (a run without usage in `tokens`), it stays at its estimate."""
    if settings.mode is CostMode.RUNS:
        return float(fair.UNIT)
    if settings.mode is CostMode.TIME:
        return None if hermes_ms is None else float(max(0, hermes_ms))
    return None if total_tokens is None or total_tokens <= 0 else float(total_tokens)


def behind(virtual: int, advance: int) -> int:
    """Where the correction of a run charged the guess leaves its key's F at the lowest, while the key has waiting
    jobs: one turn (`advance`, its estimate once the run is learnt) behind V. V moved past the tags those runs were
    charged at, by the guess (in exact fair queuing a key with waiting jobs never falls behind V); the whole
    difference given back would be a credit that a key arriving later waits behind (about slots x guess / run of the
    backlog's runs). Corrections of estimates from a history are given back whole: their errors go either way."""
    return max(0, virtual - advance)


def lined(places: Iterable[float], waiting: Callable[[int], int | None]) -> dict[int, int]:
    """V of each priority a pass granted first attempts in (their `places`), as the line alone moves it: past the tags
    granted and to the smallest tag still waiting (`waiting`), without the newcomers' pacing (fair.after_pass). What a
    correction of a charge of the guess is bounded by (`behind`): V moved past a newcomer by the pacing of a key
    that had not run yet, and a key whose own backlog waited behind it would be lifted past the keys it waits
    with."""
    granted: dict[int, list[int]] = {}
    for place in places:
        found = fair.band_of(place)
        if found is not None:
            granted.setdefault(found[0], []).append(found[1])
    return {p: max(waiting(p) or 0, *(tag + 1 for tag in tags)) for p, tags in granted.items()}


def after(starts: Iterable[int]) -> int:
    """The lowest tag a key's front may take: one past the starts of its charges in flight (`Charge.start`). A run
    Hermes refuses goes back to the line at its start: a later job of its key must stay behind it, whatever the
    settles took off the key's F meanwhile. At most MAX_TAG: a tag never spills into the next priority's band."""
    return min(max((tag + 1 for tag in starts), default=0), MAX_TAG)


def start(finish: int | None, virtual: int) -> int:
    """Where an idle key's next job starts: its finish F when it is still ahead of V (a debt), else V (a key that
    was idle banks nothing)."""
    return min(max(finish or 0, virtual), MAX_TAG)


@frozen
class Placed:
    """Where a job goes: in the line at `tag` (its key's front) or parked (ordered by `tag`, the key's projection:
    the tags its jobs would get at the estimate, a fallback order only). `advance`: its key's estimate (what a pass
    plans its next jobs by); `at_v`: a front at V (a key without a turn ahead of V, a newcomer: the store publishes
    `new S A J`, broker/admission/newcomers.py, with A = `paced`, what the newcomers' runs cost lately)."""

    job: str
    tag: int
    parked: bool
    at_v: bool = False
    advance: int = 0
    paced: int = 0


@frozen
class Charge:
    """What a grant charged its key, kept until the run settles (the store: `c:<job>` in the key's cost hash).
    `at_v`: the key came from idle at V for it (a newcomer), V moved past it by `paced` (the newcomers' pacing)."""

    key: str
    priority: int
    weight: float
    units: int
    start: int
    at_v: bool
    paced: int = 0
    guessed: bool = False  #: charged the guess (the key had no history): its correction is `behind`'s


@frozen
class KeyLine:
    """One key's state in one priority (the store: in the key's partition, broker/store/cost_store.py). While the key
    has waiting jobs (`queue`) its turns form one chain: F is where its front starts (its tag: a settle moves it),
    moved by each grant's estimate and each settle's correction (down to one turn behind V); an idle key's F is only
    a debt (None: none, at or below V)."""

    finish: int | None = None  #: F: the key's chain (where its next grant starts)
    projected: int = 0  #: where its next parked job is placed (fallback order)
    front: str | None = None  #: its job in the line (None: none waits)
    placed: Placed | None = None  #: where the front was put (a caller that lost the placing writes it again)
    queue: tuple[str, ...] = ()  #: its waiting first attempts, arrival order (the front first)


def enter(line: KeyLine, job: str, virtual: int, advance: int, paced: int | None = None) -> tuple[KeyLine, Placed]:
    """A first attempt is created: the key's front at max(F, V) when the key was idle, else parked behind its
    queue (at its projection: its F plus the estimates of the jobs ahead of it). `paced`: what V moves past a
    newcomer by (the newcomers' recent cost per this weight, `Newcomers`; default: its key's estimate)."""
    queue = (*line.queue, job)
    if not line.queue:
        tag = start(line.finish, virtual)
        at_v = tag == virtual
        paced = (advance if paced is None else paced) if at_v else 0
        placed = Placed(job, tag, parked=False, at_v=at_v, advance=advance, paced=paced)
        projected = min(tag + advance, MAX_TAG)
        return KeyLine(tag, projected, job, placed, queue), placed
    projected = min(max(line.projected, line.finish or 0), MAX_TAG)
    placed = Placed(job, projected, parked=True)
    return evolve(line, queue=queue, projected=min(projected + advance, MAX_TAG)), placed


def granted(
    line: KeyLine,
    job: str,
    scheduling: tuple[str, int, float],
    virtual: int,
    advance: int,
    *,
    charged: bool = False,
    guessed: bool = False,
    floor: int = 0,
) -> tuple[KeyLine, Charge | None, Placed | None]:
    """A job of the key was granted a slot: its key is charged `advance` (the estimate, tag units) from its chain
    (from max(F, V) for a resubmit of an idle key) unless `charged` (a grant the key paid already: a refused create's
    job granted again, or a second call after a crash); the job leaves the queue, and when it was the front the next
    one is the front, at the new F (not below `floor`, `after`). (key state, the charge, the front to place: also one
    placed before, so that a caller after a crash places it again; placing is idempotent)."""
    key, priority, weight = scheduling
    busy = bool(line.queue)
    begin = line.finish if busy and line.finish is not None else start(line.finish, virtual)
    cost = None
    finish = line.finish
    if not charged:
        front = line.placed if line.front == job else None
        at_v = front.at_v if front is not None else not busy and begin == virtual
        cost = Charge(key, priority, weight, advance, begin, at_v, front.paced if front is not None else 0, guessed)
        finish = min(begin + advance, MAX_TAG)
    queue = _without(line.queue, job)
    line = evolve(line, finish=finish, queue=queue)
    if line.front is not None and line.front != job and queue and queue[0] == line.front:
        return line, cost, line.placed  # a parked job granted by the fallback, or a second call: the front stays
    if not queue:
        return evolve(line, front=None, placed=None), cost, None
    tag = max(line.finish or 0, floor)
    placed = Placed(queue[0], tag, parked=False, advance=advance)
    return evolve(line, front=queue[0], placed=placed, projected=max(line.projected, tag + advance)), cost, placed


def _without(queue: tuple[str, ...], job: str) -> tuple[str, ...]:
    if queue and queue[0] == job:
        return queue[1:]
    return tuple(j for j in queue if j != job) if job in queue else queue


def left(line: KeyLine, job: str, advance: int = 0) -> tuple[KeyLine, Placed | None]:
    """A waiting first attempt left without a run (stopped): off the queue; when it was the front, the next one is
    the front at F (nothing charged), with its key's estimate `advance` (what a pass plans its next jobs by: without
    it a pass would plan them all at the front's tag)."""
    if job not in line.queue:
        return line, None
    queue = _without(line.queue, job)
    if line.front != job:
        return evolve(line, queue=queue), None
    if not queue:
        return evolve(line, queue=queue, front=None, placed=None), None
    placed = Placed(queue[0], line.finish or 0, parked=False, advance=advance)
    return evolve(line, queue=queue, front=queue[0], placed=placed), placed


def settled(line: KeyLine, cost: Charge, units: int | None, virtual: int, advance: int) -> tuple[KeyLine, int]:
    """A charged run settled having cost `units` (tag units; None: nothing measured, the estimate stands): F moves by
    the difference. A key with waiting jobs keeps a credit (after a run charged the guess, down to one turn behind V:
    `behind`, `advance` its new estimate); an idle key's F moves from max(F, V) (a debt counts from now; a credit
    behind V is gone). (key state, the correction)."""
    if units is None:
        return line, 0
    delta = max(units, FLOOR) - cost.units
    if delta == 0:
        return line, 0
    if line.queue and line.finish is not None:
        finish = line.finish + delta
        if delta < 0 and cost.guessed:
            finish = max(finish, behind(virtual, advance))
        finish = min(finish, MAX_TAG)
        return evolve(line, finish=finish), finish - line.finish
    finish = min(start(line.finish, virtual) + delta, MAX_TAG)
    return evolve(line, finish=finish if finish > virtual else None), delta


def retagged(line: KeyLine, advance: int, floor: int = 0) -> tuple[KeyLine, Placed | None]:
    """The front at the key's corrected F with its new estimate `advance` (a settle moves its key's front in the line
    and what a pass plans for its next jobs), never below `floor` (`after`); None when it has none or nothing
    changed."""
    if line.placed is None or line.finish is None:
        return line, None
    placed = evolve(line.placed, tag=max(line.finish, floor), advance=advance)
    return (line, None) if placed == line.placed else (evolve(line, placed=placed), placed)


class Newcomers(newcomers.Newcomers):
    """The newcomers heard (newcomers.py), paced as one key with a chain: a group of newcomers that starts at a new V
    before a pass moved V past the group before it (`entering`) has that group's cost carried, not forgotten (the
    next newcomers start behind both). The store's creates go by the V of its passes (fair.VirtualTimes) and its
    passes by newcomers.Newcomers: the model's `entering` is what they would do with no pass between creates."""

    def __init__(self, priorities: int) -> None:
        super().__init__(priorities)
        self._carried = [0] * priorities  #: where the earlier groups end (their tag plus their capped cost)
        self._room = [1] * priorities  #: the room the latest `past` was asked with (a group's cap)

    def entered(self, priority: int, tag: int, advance: int) -> None:
        index = priority - 1
        if 0 <= index < len(self._tag) and advance > 0 and tag > self._tag[index] >= 0:
            ended = self.past(priority, self._room[index])
            self._carried[index] = max(self._carried[index], ended or 0)
        super().entered(priority, tag, advance)

    def past(self, priority: int, room: int) -> int | None:
        index = priority - 1
        self._room[index] = max(1, room)
        mine = super().past(priority, room)
        if mine is None:
            return None
        return mine + max(0, self._carried[index] - self._tag[index])


def entering(virtual: int, heard: newcomers.Newcomers, priority: int, room: int) -> int:
    """The V a create uses: the line's V, or past the newcomers heard when they are further (a newcomer starts behind
    the newcomers before it, at once, not from the next pass on: so newcomers that arrive while Hermes is full, no
    pass moving V, are spaced by what they cost instead of sharing one tag)."""
    return min(max(virtual, heard.past(priority, room) or 0), MAX_TAG)


Rank = tuple[int, int, float]  #: a head's place in a pass's merge: (band, parked, tag); resubmits' band is 0


def rank(place: float, *, parked: bool) -> Rank:
    """Where a head sorts in a pass's merge: resubmits (and an older broker's places) first, then each priority's
    band, in it the line (fronts, by tag) before the parked jobs (by projection): a parked job is granted by its key's
    turns (`plan`) or, when its key has no front in the line, once no front of its priority waits (the fallback)."""
    found = fair.band_of(place)
    if found is None:
        return (0, 0, place)
    return (found[0], 1 if parked else 0, float(found[1]))


@frozen
class Head:
    """A waiting job a pass read: a key's front (`advance`: its key's estimate, kept with the front in its partition;
    `more`: how many of its key's jobs wait behind it, as the pass read its key's queue), or one job alone (a
    resubmit, an older broker's place, a parked job of the fallback)."""

    rank: Rank
    job: str
    arrival: float  #: its created ms: the order of heads of one rank
    advance: int = 0
    more: int = 0


def considered(heads: Sequence[Head], *, fallback: bool) -> list[Head]:
    """The heads a pass round plans from, of those it read in merge order (fronts and resubmits, and parked jobs). A
    parked job is planned where its priority has no front (its key's front was claimed and its key's step is not
    done yet, or is gone): so nothing of a later priority passes it. Where its priority has a front it waits for its
    key's turn (`plan`'s `more`), and the round plans nothing after it (strict priority), unless it is the last round
    (`fallback`: nothing idles for fairness)."""
    fronts = {head.rank[0] for head in heads if head.rank[1] == 0}
    chosen: list[Head] = []
    for head in heads:
        if not fallback and head.rank[1] == 1 and head.rank[0] in fronts:
            break
        chosen.append(head)
    return chosen


def plan(heads: Sequence[Head], most: int) -> list[tuple[Head, int]]:
    """The pass's next `most` grants in line order, as (head, n): the head's key's n-th job (0: the head itself; a
    front's next jobs are parked, and each starts where the one before ends, at its estimate: their tags are the ones
    `granted` will charge; at most `more` of them)."""
    todo = [(head.rank, head.arrival, 0, index) for index, head in enumerate(heads)]
    heapq.heapify(todo)
    chosen: list[tuple[Head, int]] = []
    while todo and len(chosen) < most:
        place, arrival, n, index = heapq.heappop(todo)
        head = heads[index]
        chosen.append((head, n))
        if n < head.more:
            band, parked, tag = place
            heapq.heappush(todo, ((band, parked, tag + head.advance), arrival, n + 1, index))
    return chosen
