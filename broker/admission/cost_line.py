"""A pure model of the admission line with costs (SPEC S4.1, S4.2 "What a turn costs"), for property tests: the
store's structures and steps, driven by a clock, Hermes slots and runs of given lengths. No IO.

What it keeps, as the store would (broker/store/cost_store.py): per job partition the line (fronts and resubmits, by
score) and the parked jobs (by projection); per key and priority its KeyLine (in the key's partition); per key its
History and the charges of its runs in flight; V per priority and the newcomers heard (in `{adm}` and per replica).
A pass is rounds of: merge the heads (line, then parked: cost.rank), `cost.choose`, claim, `cost.granted` per first
attempt (fair_next.lua), place the new fronts; then V moves as fair.after_pass says, past the tags the grants were
charged from. A settle is `cost.settled` and `cost.retagged` (fair_settle.lua: the key's front moves to its corrected
F). A replica that dies between a claim and its key's step (`crashes`) leaves it to the job's takeover, `lease_ms`
later, or to its settle, whichever comes first.
"""

from __future__ import annotations

import heapq
import zlib
from collections.abc import Callable, Iterable

from attrs import define, field, frozen

from broker.admission import cost, fair
from broker.admission.cost import Charge, CostMode, CostSettings, History, KeyLine, Placed
from broker.admission.newcomers import Newcomers

ROUNDS = 3  #: pass rounds at most (each: claims, the keys' steps, the new fronts); the last one takes parked jobs
RESUBMIT = 1.0  #: resubmits' scores are below fair.BASE (their created ms): the model's are their arrival rank + 1


@frozen
class Job:
    id: str
    key: str
    arrive_ms: int = 0
    run_ms: int = 10_000  #: how long its run holds a slot
    tokens: int = 0  #: what its run reports (`tokens`); 0: no usage
    weight: float = 1.0
    priority: int = fair.DEFAULT_PRIORITY
    interrupt_ms: int | None = None  #: its first run is interrupted this long after its start, then resubmitted
    stop_ms: int | None = None  #: stopped at this time if it still waits


@frozen
class Start:
    """A run started: what it will cost (the mode's unit, measured: the share a test counts)."""

    at_ms: int
    job: str
    key: str
    attempt: int
    cost: float
    held_ms: int  #: the Hermes time it holds a slot
    resubmit: bool
    parked: bool  #: granted by the fallback


@frozen
class Live:
    job: Job
    attempt: int
    started_ms: int
    ends_ms: int
    interrupted: bool


def _never(job_id: str) -> bool:
    return False


@define
class CostLine:
    settings: CostSettings = field(factory=CostSettings)
    slots: int = 10
    partitions: int = 8
    rounds: int = ROUNDS
    lease_ms: int = 30_000
    crashes: Callable[[str], bool] = _never  #: the pass granting this job dies before its key's step
    now: int = 0
    lines: dict[int, dict[str, float]] = field(factory=dict)  #: partition -> job -> score (fronts, resubmits)
    parked: dict[int, dict[str, float]] = field(factory=dict)  #: partition -> job -> band + projection
    keys: dict[tuple[int, str], KeyLine] = field(factory=dict)
    history: dict[str, History] = field(factory=dict)
    fresh: History = field(factory=History)  #: the newcomers' runs (the store: `fresh:<mode>` in `{adm}:state`)
    charges: dict[str, Charge] = field(factory=dict)  #: job -> what its run in flight was charged
    virtual: list[int] = field(factory=lambda: [0] * len(fair.PRIORITIES))
    lined: list[int] = field(factory=lambda: [0] * len(fair.PRIORITIES))  #: V but for the newcomers' pacing
    newcomers: Newcomers = field(factory=lambda: cost.Newcomers(len(fair.PRIORITIES)))
    arrival: dict[str, int] = field(factory=dict)
    jobs: dict[str, Job] = field(factory=dict)
    attempts: dict[str, int] = field(factory=dict)
    live: dict[str, Live] = field(factory=dict)
    pending: dict[str, int] = field(factory=dict)  #: job -> when its takeover does the key step a crash skipped
    starts: list[Start] = field(factory=list)
    record: bool = False  #: keep every pass in `passes` (what it granted, what still waited)
    #: (when, granted, still waiting, slots left free) of every pass, with `record`
    passes: list[tuple[int, list[str], set[str], int]] = field(factory=list)
    #: every placing, a pass's merge reads the valid ones in order (a model's index of the partitions' zsets)
    heads: list[tuple[cost.Rank, int, str, bool, float]] = field(factory=list)
    advance: dict[str, int] = field(factory=dict)  #: a front -> its key's estimate (the store: with the front)

    # the store's writes -----------------------------------------------------------------------------------------

    def create(self, job: Job) -> Placed:
        """fair_turn.lua (the key's partition), then the job write (the job's): in the line or parked."""
        self.jobs[job.id] = job
        self.arrival[job.id] = len(self.arrival)
        p = job.priority
        line = self.keys.get((p, job.key), KeyLine())
        fresh = self.fresh.runs > 0  # no newcomer's run settled yet: its key's estimate (the store's rule)
        paced = cost.charge(self.fresh.estimate(self.settings), job.weight) if fresh else None
        virtual = cost.entering(self.virtual[p - 1], self.newcomers, p, self.slots)
        line, placed = cost.enter(line, job.id, virtual, self._advance(job), paced)
        self.keys[(p, job.key)] = line
        self._place(job, placed, new=True)
        return placed

    def stop(self, job_id: str) -> None:
        """A waiting job is stopped: the stop's job write takes it off the line, then fair_next.lua (as `left`)."""
        job = self.jobs.get(job_id)
        if job is None:
            return  # not created (yet): a stop of a job that does not exist
        partition = self._partition(job_id)
        waited = self.lines.get(partition, {}).pop(job_id, None) or self.parked.get(partition, {}).pop(job_id, None)
        if waited is None or self.attempts.get(job_id, 0) > 0:
            return
        key = (job.priority, job.key)
        line, front = cost.left(self.keys[key], job_id, self._advance(job))
        self.keys[key] = line
        if front is not None:
            self._place(self.jobs[front.job], front)

    def _place(self, job: Job, placed: Placed, *, new: bool = False) -> None:
        """The job write (`new`) or the promotion script, in the job's partition: parked, or in the line at its tag;
        a promotion moves a parked job only (placing again after a crash changes nothing; a job claimed or stopped
        since is not placed)."""
        partition = self._partition(job.id)
        if placed.parked:
            self._put(self.parked, partition, job.id, float(fair.score(job.priority, placed.tag)), parked=True)
            return
        if new or job.id in self.parked.get(partition, {}):
            self.parked.get(partition, {}).pop(job.id, None)
            self._put(self.lines, partition, job.id, float(fair.score(job.priority, placed.tag)), parked=False)
            self.advance[job.id] = placed.advance
            if placed.at_v:
                self.newcomers.entered(job.priority, placed.tag, placed.paced)

    def _move(self, job: Job, placed: Placed) -> None:
        """A front moved to its key's corrected F (ZADD XX in its partition: only while it waits in the line)."""
        partition = self._partition(job.id)
        if job.id in self.lines.get(partition, {}):
            self._put(self.lines, partition, job.id, float(fair.score(job.priority, placed.tag)), parked=False)
            self.advance[job.id] = placed.advance

    # a pass --------------------------------------------------------------------------------------------------------

    def admit(self) -> list[str]:
        """One pass: as many grants as free slots, in rounds (`cost.plan` over the heads read; the jobs its keys'
        queues hold claimed; each key's step); then V moves (fair.after_pass)."""
        granted: list[str] = []
        places: list[float] = []
        for round_ in range(self.rounds):
            room = self.slots - len(self.live)
            heads = self._heads(room, fallback=round_ == self.rounds - 1) if room > 0 else []
            if not heads:
                break
            planned = [(head, n, self._nth(head, n)) for head, n in cost.plan(heads, room)]  # the queues read first
            for head, n, job_id in planned:
                if job_id is None or not self._waits(job_id):
                    continue  # its key's queue was shorter (or another pass took it): the next round
                self._claim(job_id)
                charged = job_id in self.charges
                self._grant(job_id, parked=n > 0 or head.rank[1] == 1)
                if head.rank[0] > 0 and not charged and job_id in self.charges:  # V moves past where it was charged
                    places.append(float(fair.score(self.jobs[job_id].priority, self.charges[job_id].start)))
                granted.append(job_id)
        moved = fair.after_pass(self.virtual, places, self._smallest, self.newcomers, self.slots)
        for priority, tag in moved.items():
            self.virtual[priority - 1] = min(tag, fair.MAX_TAG)
        for priority, tag in cost.lined(places, self._smallest).items():
            self.lined[priority - 1] = max(self.lined[priority - 1], tag)
        if self.record:
            self.passes.append((self.now, granted, self.waiting(), self.slots - len(self.live)))
        return granted

    def _heads(self, most: int, *, fallback: bool) -> list[cost.Head]:
        """What a pass reads: the first `most` fronts and resubmits over the partitions' lines, with the fronts'
        estimates; the parked jobs too in the last round, or when nothing else waits (the fallback)."""
        merged = [self._head(rank, job_id, parked) for rank, job_id, parked in self._merged(most + len(self.live) + 1)]
        return cost.considered(merged, fallback=fallback)[:most]

    def _head(self, rank: cost.Rank, job_id: str, parked: bool) -> cost.Head:
        """A head as the pass reads it: a front with its key's estimate and how many of its key's jobs wait behind it
        (the store: its key's queue, ZRANGE q:<p>:<key>, read for the fronts a pass may grant)."""
        arrival = float(self.arrival[job_id])
        if parked or job_id not in self.advance:
            return cost.Head(rank, job_id, arrival)
        job = self.jobs[job_id]
        queue = self.keys.get((job.priority, job.key), KeyLine()).queue
        more = len(queue) - 1 if queue and queue[0] == job_id else 0
        return cost.Head(rank, job_id, arrival, self.advance[job_id], more)

    def _nth(self, head: cost.Head, n: int) -> str | None:
        """The n-th job of the head's key (read from its queue when n > 0; the store: ZRANGE q:<p>:<key>)."""
        if n == 0:
            return head.job
        job = self.jobs[head.job]
        queue = self.keys.get((job.priority, job.key), KeyLine()).queue
        if not queue or queue[0] != head.job or n >= len(queue):
            return None
        return queue[n]

    def _waits(self, job_id: str) -> bool:
        partition = self._partition(job_id)
        return job_id in self.lines.get(partition, {}) or job_id in self.parked.get(partition, {})

    def _put(
        self, zsets: dict[int, dict[str, float]], partition: int, job_id: str, place: float, *, parked: bool
    ) -> None:
        zsets.setdefault(partition, {})[job_id] = place
        rank = cost.rank(place, parked=parked)
        heapq.heappush(self.heads, (rank, self.arrival[job_id], job_id, parked, place))

    def _merged(self, most: int) -> list[tuple[cost.Rank, str, bool]]:
        """The first `most` waiting jobs in the order of a pass's merge (rank, then arrival: the ties' order)."""
        found: list[tuple[cost.Rank, int, str, bool, float]] = []
        while self.heads and len(found) < most:
            entry = heapq.heappop(self.heads)
            _, _, job_id, parked, place = entry
            zsets = self.parked if parked else self.lines
            if zsets.get(self._partition(job_id), {}).get(job_id) == place:
                found.append(entry)
        for entry in found:
            heapq.heappush(self.heads, entry)
        return [(rank, job_id, parked) for rank, _, job_id, parked, _ in found]

    def _claim(self, job_id: str) -> None:
        partition = self._partition(job_id)
        if self.lines.get(partition, {}).pop(job_id, None) is None:
            self.parked[partition].pop(job_id)
        self.advance.pop(job_id, None)

    def _grant(self, job_id: str, parked: bool) -> None:
        job = self.jobs[job_id]
        attempt = self.attempts.get(job_id, 0) + 1
        self.attempts[job_id] = attempt
        if self.crashes(job_id) and attempt == 1:
            self.pending[job_id] = self.now + self.lease_ms  # the key's step waits for the takeover
        else:
            self._key_step(job)
        interrupted = attempt == 1 and job.interrupt_ms is not None
        held = job.interrupt_ms if interrupted and job.interrupt_ms is not None else job.run_ms
        self.live[job_id] = Live(job, attempt, self.now, self.now + held, interrupted)
        used = self._measured(job, held, interrupted)
        self.starts.append(Start(self.now, job_id, job.key, attempt, used or 0.0, held, attempt > 1, parked))

    def _key_step(self, job: Job) -> None:
        """fair_next.lua: charge the key, take the job off its queue, and place its next front (promotion)."""
        p = job.priority
        key = (p, job.key)
        line = self.keys.get(key, KeyLine())
        charged = job.id in self.charges
        scheduling = (job.key, p, job.weight)
        guessed = self.settings.mode is not CostMode.RUNS and not self.history.get(job.key, History()).runs
        floor = self._floor(key)
        line, charge, front = cost.granted(
            line,
            job.id,
            scheduling,
            self.virtual[p - 1],
            self._advance(job),
            charged=charged,
            guessed=guessed,
            floor=floor,
        )
        self.keys[key] = line
        if charge is not None:
            self.charges[job.id] = charge
        if front is not None:
            self._place(self.jobs[front.job], front)

    # runs ----------------------------------------------------------------------------------------------------------

    def settle(self, job_id: str) -> None:
        """The run's settle: fair_settle.lua (its key's history and correction, and its front moved), fair_fresh.lua
        (a newcomer's cost learnt), then admission_release.lua (the slot); an interrupted first attempt goes back to
        the front of the line (a resubmit)."""
        run = self.live.pop(job_id)
        job = run.job
        if job_id in self.pending:  # the settle finds its key's step not done: does it
            del self.pending[job_id]
            self._key_step(job)
        charge = self.charges.pop(job_id, None)
        measured = self._measured(job, self.now - run.started_ms, run.interrupted)
        if measured is not None:
            self.history[job.key] = self.history.get(job.key, History()).settled(measured)
        if charge is not None:
            self._correct(job, charge, None if measured is None else cost.charge(measured, job.weight))
            if charge.at_v and measured is not None:
                self.fresh = self.fresh.settled(measured)
        if run.interrupted:
            self._put(self.lines, self._partition(job_id), job_id, RESUBMIT + self.arrival[job_id], parked=False)

    def _correct(self, job: Job, charge: Charge, units: int | None) -> None:
        p = job.priority
        key = (p, job.key)
        advance = self._advance(job)
        virtual = min(self.virtual[p - 1], self.lined[p - 1])  # cost.settled's `virtual`: cost.lined
        line, _ = cost.settled(self.keys.get(key, KeyLine()), charge, units, virtual, advance)
        line, front = cost.retagged(line, advance, self._floor(key))  # the front moves to the corrected F
        if front is not None:
            self._move(self.jobs[front.job], front)
        self.keys[key] = line

    def _floor(self, key: tuple[int, str]) -> int:
        """cost.after over the key's charges in flight (the store: the `c:` fields of its cost hash)."""
        return cost.after(c.start for c in self.charges.values() if (c.priority, c.key) == key)

    def takeover(self, job_id: str) -> None:
        """The replica that claimed the job died before its key's step: the job's takeover does it."""
        if self.pending.pop(job_id, None) is not None:
            self._key_step(self.jobs[job_id])

    def _measured(self, job: Job, held_ms: int, interrupted: bool) -> float | None:
        tokens = None if interrupted or job.tokens <= 0 else job.tokens
        return cost.measured(self.settings, held_ms, tokens)

    # what the test reads -------------------------------------------------------------------------------------------

    def waiting(self) -> set[str]:
        return {job for zsets in (self.lines, self.parked) for members in zsets.values() for job in members}

    def _smallest(self, priority: int) -> int | None:
        return fair.smallest((place for members in self.lines.values() for place in members.values()), priority)

    def _advance(self, job: Job) -> int:
        return cost.estimate(self.history.get(job.key, History()), self.settings, job.weight)

    def _partition(self, job_id: str) -> int:
        return zlib.crc32(job_id.encode()) % self.partitions


def simulate(line: CostLine, jobs: Iterable[Job], until_ms: int) -> CostLine:
    """Drive `line` with `jobs` until `until_ms`: at each moment something happens, the runs that end settle, the
    takeovers due run, the stops and the creates are written, then one pass fills the free slots."""
    arrivals = sorted((job for job in jobs if job.id not in line.jobs), key=lambda job: job.arrive_ms)  # resumable
    stops = sorted((job.stop_ms, job.id) for job in jobs if job.stop_ms is not None and job.stop_ms > line.now)
    index = 0
    while True:
        moments = [run.ends_ms for run in line.live.values()] + list(line.pending.values())
        moments += [at for at, _ in stops[:1]]
        if index < len(arrivals):
            moments.append(arrivals[index].arrive_ms)
        if not moments or min(moments) > until_ms:
            return line
        line.now = max(line.now, min(moments))
        for job_id in [j for j, run in line.live.items() if run.ends_ms <= line.now]:
            line.settle(job_id)
        for job_id in [j for j, at in line.pending.items() if at <= line.now]:
            line.takeover(job_id)
        while index < len(arrivals) and arrivals[index].arrive_ms <= line.now:
            line.create(arrivals[index])
            index += 1
        while stops and stops[0][0] <= line.now:
            line.stop(stops.pop(0)[1])
        line.admit()


def shares(
    starts: Iterable[Start], keys: Iterable[str], since_ms: int, until_ms: int, *, hermes_time: bool = False
) -> dict[str, float]:
    """Each key's share of what the runs started in [since, until) cost (`hermes_time`: of their slot time)."""
    used = dict.fromkeys(keys, 0.0)
    for start in starts:
        if since_ms <= start.at_ms < until_ms and start.key in used:
            used[start.key] += start.held_ms if hermes_time else start.cost
    total = sum(used.values())
    return {key: (value / total if total else 0.0) for key, value in used.items()}


def backlog(key: str, count: int, run_ms: int, *, weight: float = 1.0, at_ms: int = 0, tokens: int = 0) -> list[Job]:
    """`count` jobs of `key` created at once."""
    return [Job(f"{key}-{i:05d}", key, at_ms, run_ms, tokens, weight) for i in range(count)]


__all__ = ["CostLine", "CostMode", "Job", "Start", "backlog", "shares", "simulate"]
