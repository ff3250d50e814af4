"""A job's entry to and exit from its key's queue when `ADMISSION_FAIRNESS_COST` is `time` or `tokens` (SPEC S4.2 "What
a turn costs"; broker/admission/cost.py): the job store's side of broker/store/cost_store.py.

    create  on a cluster fair_turn_cost.lua first (the key's partition), then the job write (the job's partition)
            puts the job in the line as its key's front, with its fronts entry, or among the parked jobs (`fields`);
            on a single Redis the job write does both (`turn`: the script composed in)
    end     the job write of a job that ends while it waits takes it off the line or the parked jobs; then its key's
            step (`left`) drops it from the key's queue, and a front it was is followed by the key's next one

On a cluster the key's script runs before the job write: a create that dies between the two leaves the job id in
its key's queue (design 8: the client's retry places it again; `left` drops it when the write was refused or the job
exists finished). `runs` keeps today's path (fair_turn.lua, fixed tags at create): the job
store then has no CostEntry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

from redis.asyncio import Redis

from broker.admission import cost, fair
from broker.admission.cost import CostSettings, History, Placed
from broker.events import JobStatus
from broker.logging import get_logger
from broker.store import signals
from broker.store import usage as usage_store
from broker.store.batch import ScriptBatch
from broker.store.cost_store import CostStore, Front, Step, entry_tail
from broker.store.outage import is_outage
from broker.store.scripts import Scripts
from projections.job import JobView
from projections.usage import Used

#: Fronts found gone in a row that one `left` follows (each reported `left` in turn); the rest wait for the next step.
GONE_ROUNDS = 3
#: How often a replica that creates jobs reads the newcomers' recent cost (other replicas' settles move it).
FRESH_REFRESH_MS = 1_000


class CostEntry:
    """Creates and ends of first attempts in cost-aware fair shares."""

    def __init__(
        self,
        redis: Redis,
        settings: CostSettings,
        retention_ms: int,
        scripts: Scripts | None = None,
        batch: ScriptBatch | None = None,
    ) -> None:
        """`batch`: the job writes' pipeline of a single Redis (settles and placings join it)."""
        self.store = CostStore(redis, settings, retention_ms, scripts, batch)
        #: the newcomers' recent runs (SPEC S4.2: keys without a turn are paced as one key, by what their runs cost),
        #: as this replica's settles of them left it, or read every FRESH_REFRESH_MS
        self.fresh = History()
        self._fresh_read_at_ms: int | None = None
        self._reading: asyncio.Task[None] | None = None

    async def enter(self, job_id: str, view: JobView, virtual: int) -> Placed:
        """The job joins its key's queue (fair_turn_cost.lua at the line's V), on a cluster before its job write:
        its key's front, or parked; a front at V moves V past it by the newcomers' recent cost (its key's estimate
        while no newcomer's run settled)."""
        s = view.scheduling
        return await self.store.enter(
            job_id, s.fairness_key, s.priority, s.fairness_weight, view.created_at_ms, virtual, self._paced(view)
        )

    def turn(self, job_id: str, view: JobView, virtual: int, write: dict[str, object]) -> None:
        """On a single Redis the job joins its key's queue inside its create's job write (append_events.lua's
        `cost.turn`, fair_turn_cost.lua composed in): what the write carries for it. A replayed or refused create
        takes no turn."""
        s = view.scheduling
        args = self.store.enter_args(
            job_id, s.fairness_key, s.priority, s.fairness_weight, view.created_at_ms, virtual, self._paced(view)
        )
        turn = {
            "args": [str(arg) for arg in args],
            "band": str(fair.front(s.priority)),
            "tail": entry_tail(s.fairness_key),
            "prefix": signals.NEWCOMER,
        }
        write["cost"] = {"turn": turn}

    def _paced(self, view: JobView) -> int | None:
        """What V moves past a front at V by: the newcomers' recent cost (None: its key's estimate)."""
        self._refresh(view.created_at_ms)
        if not self.fresh.runs:
            return None
        return cost.estimate(self.fresh, self.store.settings, view.scheduling.fairness_weight)

    async def warm(self, now_ms: int) -> None:
        """Read the newcomers' recent cost before the first create (SharedRead's outage rules are the caller's)."""
        self.fresh = await self.store.read_fresh()
        self._fresh_read_at_ms = now_ms

    def _refresh(self, now_ms: int) -> None:
        """Read the newcomers' recent cost behind the create's back when this replica's is older than
        FRESH_REFRESH_MS (other replicas' settles teach it)."""
        if self._reading is not None or (
            self._fresh_read_at_ms is not None and now_ms - self._fresh_read_at_ms < FRESH_REFRESH_MS
        ):
            return
        self._fresh_read_at_ms = now_ms
        self._reading = asyncio.create_task(self._read_fresh())

    async def _read_fresh(self) -> None:
        try:
            read = await self.store.read_fresh()
            if read.runs >= self.fresh.runs:  # a settle of this replica's meanwhile counted one more
                self.fresh = read
        except Exception as error:  # a task of its own: nothing may escape; the next create past the interval tries
            if not is_outage(error):
                get_logger(type(self)).error("Could not read the newcomers' recent cost.", exc_info=error)
        finally:
            self._reading = None

    @staticmethod
    def fields(job_id: str, view: JobView, placed: Placed, write: dict[str, object]) -> None:
        """What the create's job write carries for `placed` (fields beside job_write.entering's): the place, the
        `cost` object of append_events.lua and, for a front at V, `new S A J` with A its key's pacing (`paced`)."""
        s = view.scheduling
        score = fair.score(s.priority, placed.tag)
        write["place"] = str(score)
        if placed.parked:
            write["cost"] = {"park": "1"}
            return
        write["cost"] = {"entry": Front(s.fairness_key, s.priority, placed).entry}
        if placed.at_v:
            joined = dict(write["joined"]) if isinstance(write["joined"], dict) else {}
            joined["message"] = signals.newcomer_message(job_id, score, placed.paced)
            write["joined"] = joined

    async def written(
        self, view: JobView, before: JobView | None, usage: Sequence[tuple[int, bytes]], virtual: int
    ) -> None:
        """After a job write: a first attempt that ended before any run leaves its key's queue (a no-op when it was
        granted), and the runs it settled correct their key's charges."""
        if view.status.terminal and not view.accepted_attempt and not (before and before.status.terminal):
            await self.left(view.job_id, view, virtual)
            await self.unrun(view, virtual)
        facts = [used for used in (usage_store.decode(fact.decode()) for _, fact in usage) if used and used.settles]
        if facts:
            await self.settled(view, facts, virtual, view.updated_at_ms)

    async def waits(self, view: JobView) -> bool:
        """Is the job in its partition's line or among its parked jobs (not granted yet)?"""
        return view.status is JobStatus.QUEUED and await self.store.waiting(view.job_id)

    async def left(self, job_id: str, view: JobView, virtual: int) -> None:
        """A first attempt left its key's queue without a run (stopped, expired, or its create refused): the key's
        step drops it, and when it was the front the key's next job joins the line."""
        s = view.scheduling
        step = await self.store.step(s.fairness_key, s.priority, s.fairness_weight, virtual, [Step(job_id, left=True)])
        await self.place(step.front, s.fairness_weight, virtual)

    async def unrun(self, view: JobView, virtual: int) -> None:
        """A first attempt that ended before Hermes took a run of it held no slot: a grant's charge of it (its key's
        estimate) is corrected to nothing (fair_settle.lua, once per attempt; one never granted was charged nothing)."""
        s = view.scheduling
        if not await self.store.charged(view.job_id, s.fairness_key):
            return  # never granted: its key was charged nothing
        done = await self.store.settle(
            view.job_id, view.attempt, s.fairness_key, s.priority, s.fairness_weight, 0.0, virtual, view.updated_at_ms
        )
        await self.place(done.front, s.fairness_weight, virtual, move=True)

    async def settled(self, view: JobView, facts: Sequence[Used], virtual: int, now_ms: int) -> None:
        """Runs of the job settled (`facts`: its usage facts that settle a run, SPEC S4.5): each attempt's charge is
        corrected by what it measured (fair_settle.lua, once per attempt; a run never stepped, a resubmit's, is
        charged what it measured), and the key's front the settle names is placed."""
        s = view.scheduling
        for used in facts:
            attempt = _attempt(used.marker, view)
            if not used.settles or attempt is None:
                continue
            measured = cost.measured(self.store.settings, used.hermes_ms, used.total_tokens or None)
            done = await self.store.settle(
                view.job_id, attempt, s.fairness_key, s.priority, s.fairness_weight, measured, virtual, now_ms
            )
            if done.applied and done.at_v and measured is not None:
                await self._newcomer_settled(measured)
            await self.place(done.front, s.fairness_weight, virtual, move=True)

    async def missed(
        self,
        facts: Sequence[Used],
        views: Callable[[Sequence[str]], Awaitable[Sequence[JobView | None]]],
        virtual: Callable[[int], int],
    ) -> None:
        """The runs `facts` settle (the usage sweep's) whose job's charge is still in flight (`c:<job>`) are settled
        as the job write's own settle would have: a crash or an outage after the write lost it. `virtual`: V by
        priority. A run whose settle is only late (the sweep read its fact first) is settled once all the same."""
        settling = [used for used in facts if used.settles]
        jobs = [used.marker.partition(":")[0] for used in settling]
        charged = await self.store.charges_in_flight(
            [(job, used.key) for job, used in zip(jobs, settling, strict=True)]
        )
        missed = [(job, used) for job, used, flying in zip(jobs, settling, charged, strict=True) if flying]
        if not missed:
            return
        for (_, used), view in zip(missed, await views([job for job, _ in missed]), strict=True):
            if view is not None:
                await self.settled(view, [used], virtual(view.scheduling.priority), view.updated_at_ms)

    async def _newcomer_settled(self, measured: float) -> None:
        """A newcomer's run settled: the newcomers' recent cost learnt (fair_fresh.lua). Pacing only: a failure is
        logged, and the job's write stands."""
        try:
            self.fresh = await self.store.fresh(measured)
        except Exception as error:
            if not is_outage(error):
                raise
            get_logger(type(self)).warning("Could not count a newcomer's run in their pacing.", exc_info=error)

    async def place(self, front: Front | None, weight: float, virtual: int, *, move: bool = False) -> None:
        """Put a key's front in its line (`move`: a settle's, to its corrected turn); one found gone (claimed or
        stopped since) is reported `left` and its key's next one placed, GONE_ROUNDS at most (the rest wait for the
        key's next step)."""
        for _ in range(GONE_ROUNDS):
            if front is None or (await self.store.promote([front], move=move))[0] != 0:
                return
            left = [Step(front.placed.job, left=True)]
            front = (await self.store.step(front.key, front.priority, weight, virtual, left)).front


def _attempt(marker: str, view: JobView) -> int | None:
    """The attempt a settling usage fact settles: `<job>:<attempt>:i` an interrupted one, `<job>:end` the last
    accepted (None: no run was)."""
    parts = marker.split(":")
    if len(parts) == 3 and parts[2] == "i" and parts[1].isdigit():
        return int(parts[1])
    return view.accepted_attempt or None
