"""The Redis side of cost-aware fair shares (SPEC S4.2 "What a turn costs", `ADMISSION_FAIRNESS_COST`): one method
per script, each the store's copy of a function of broker/admission/cost.py, in one slot.

    enter    fair_turn_cost.lua  (the key's partition)  cost.enter: the job is its key's front, or parked
    step     fair_next.lua       (the key's partition)  cost.granted / cost.left for the jobs of one key a pass claimed
    settle   fair_settle.lua     (the key's partition)  cost.settled and History.settled, once per attempt
    promote  fair_promote.lua    (the front's partition) a key's next front from the parked jobs to the line
    heads    line_heads.lua      (each job partition)   the line's and the parked jobs' heads, and the fronts' entries
    unpark   fair_unpark.lua     (each job partition)   the parked jobs to the line, before going back to a broker
                                                        that reads the line only

A key step returns its key's front, which the caller places with `promote` (another slot): placing is idempotent,
so a caller that died between the two leaves the front to the next step of its key. The replies are narrowed by
the pure functions at the bottom. The job store's creates and stops call it through broker/store/cost_entry.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from attrs import evolve, field, frozen
from redis.asyncio import Redis

from broker.admission import fair
from broker.admission.cost import Charge, CostSettings, History, KeyLine, Placed
from broker.store import keys, signals
from broker.store.batch import ScriptBatch
from broker.store.connection import is_cluster
from broker.store.replies import scored, text
from broker.store.scripts import Scripts, run_many

NEXT = 16  #: the waiting jobs behind a front a key step names (what a pass may plan without reading the key)


@frozen
class Front:
    """A key's front as a key step left it: where it goes in its partition's line, how many of its key's jobs wait
    behind it (`more`) and the first of them (`next`)."""

    key: str
    priority: int
    placed: Placed
    more: int = 0
    next: tuple[str, ...] = ()
    seq: int = field(default=0, eq=False)  #: a settle's: its key's settle count (its placing yields to a later's)

    @property
    def score(self) -> int:
        return fair.score(self.priority, self.placed.tag)

    @property
    def entry(self) -> str:
        """Its `fronts` entry: `advance|more|next ids|key` (the key last: a fairness key may hold any character)."""
        return f"{self.placed.advance}{entry_tail(self.key, self.more, self.next)}"

    @property
    def message(self) -> str:
        """What joining the line publishes: `new S A J` for a front at V (a newcomer), else `line J`."""
        if self.placed.at_v:
            return signals.newcomer_message(self.placed.job, self.score, self.placed.paced)
        return signals.joined_message(self.placed.job)


@frozen
class Entry:
    """A front's `fronts` entry as a pass reads it (line_heads.lua)."""

    advance: int
    more: int
    next: tuple[str, ...]
    key: str


@frozen
class Heads:
    """One partition's heads: the line's first jobs and the parked jobs' first, by score, and the line's fronts."""

    line: tuple[tuple[str, float], ...] = ()
    parked: tuple[tuple[str, float], ...] = ()
    fronts: tuple[tuple[str, Entry], ...] = ()
    arrived: tuple[tuple[str, float], ...] = ()  #: created ms of the jobs read (read `arrived`), where known


@frozen
class Step:
    """A job of a key a pass took: granted (its run starts) or `left` (stopped, or gone, while it waited)."""

    job: str
    attempt: int = 1
    left: bool = False


@frozen
class KeyStep:
    """What a key step did: how many jobs it charged, the tag each charged job started at (what V moves past, SPEC
    S4.2), and the key's front to place (None: none waits), or `placed` there already (fair_promote's answer: the
    front was the one expected)."""

    charged: int
    front: Front | None
    begins: tuple[tuple[str, int], ...] = ()
    placed: int | None = None


@frozen
class Settled:
    """What a settle did (fair_settle.lua): `applied` False when that attempt was settled before; `delta` the
    correction of F; `at_v` a newcomer's run (its cost teaches the newcomers' pacing, fair_fresh.lua), `paced` what V
    moved past it by, `units` what it measured (None: nothing); the key's front to place."""

    applied: bool
    delta: int
    at_v: bool
    paced: int
    units: int | None
    front: Front | None


class CostStore:
    """Cost-aware turns of the fairness keys (SPEC S4.2), for one `ADMISSION_FAIRNESS_COST` setting."""

    def __init__(
        self,
        redis: Redis,
        settings: CostSettings,
        retention_ms: int,
        scripts: Scripts | None = None,
        batch: ScriptBatch | None = None,
    ) -> None:
        """`batch`: the job writes' pipeline of a single Redis, which a runner's settle and its front's placing join
        (the passes' scripts go in pipelines of their own)."""
        self._redis = redis
        self.settings = settings
        self._retention_ms = retention_ms  #: RUNS_RETENTION: a key's History and settled charges age out with it
        self._scripts = scripts or Scripts(redis)
        self._batch = batch
        self._single = not is_cluster(redis)  #: a single Redis: a key step may place its front too

    def _args(self, key: str, priority: int, weight: float, virtual: int) -> list[str | int]:
        s = self.settings
        return [key, priority, repr(float(weight)), virtual, s.mode.value, s.guess, self._retention_ms]

    def enter_args(
        self, job: str, key: str, priority: int, weight: float, created_ms: int, virtual: int, paced: int | None
    ) -> list[str | int]:
        """fair_turn_cost.lua's ARGV (its KEYS: keys.cost_keys(key, priority))."""
        return [*self._args(key, priority, weight, virtual), job, created_ms, "" if paced is None else paced]

    async def enter(
        self, job: str, key: str, priority: int, weight: float, created_ms: int, virtual: int, paced: int | None
    ) -> Placed:
        """A first attempt is created (cost.enter at `virtual`, cost.entering's V): its key's front, or parked.
        `paced`: what V moves past it by when it starts at V (None: its key's estimate). A single Redis's creates
        run this script inside their job write instead (CostEntry.turn)."""
        args = self.enter_args(job, key, priority, weight, created_ms, virtual, paced)
        reply = await self._scripts.fair_turn_cost(keys=keys.cost_keys(key, priority).all, args=args)
        tag, parked, at_v, advance, placed_paced = (int(x) for x in _strings(reply))
        return Placed(job, tag, parked == 1, at_v == 1, advance, placed_paced)

    async def step(self, key: str, priority: int, weight: float, virtual: int, jobs: Sequence[Step]) -> KeyStep:
        """One key's step (fair_next.lua) for the jobs a pass took of it, in order."""
        return (await self.steps([(key, priority, weight, virtual, jobs)]))[0]

    async def steps(
        self,
        calls: Sequence[tuple[str, int, float, int, Sequence[Step]]],
        expected: Sequence[str | None] = (),
    ) -> list[KeyStep]:
        """Several keys' steps, one pipeline (one script per key, in its partition). `expected`: per call, the front
        its caller expects the step to leave; on a single Redis the step places that front itself (a step that
        leaves another names it, to place)."""
        script_calls: list[tuple[Sequence[str], Sequence[str | int]]] = []
        for i, (key, priority, weight, virtual, jobs) in enumerate(calls):
            each = [x for j in jobs for x in (j.job, j.attempt, "left" if j.left else "grant")]
            script_keys = keys.cost_keys(key, priority).all
            front = expected[i] if i < len(expected) and self._single else None
            if front is not None:  # a single Redis: the front's partition in the same script (no slots there)
                script_keys = [*script_keys, *_placing_keys(front)]
            placing: list[str | int] = [
                front or "",
                fair.front(priority),
                keys.SIGNALS,
                signals.NEWCOMER,
                signals.JOINED,
            ]
            script_calls.append((script_keys, [*self._args(key, priority, weight, virtual), *placing, *each]))
        replies = await run_many(self._redis, self._scripts.fair_next, script_calls)
        steps = []
        for (key, priority, *_), reply in zip(calls, replies, strict=True):
            items = _strings(reply)
            pairs = items[1].split()
            begins = tuple((job, int(tag)) for job, tag in zip(pairs[::2], pairs[1::2], strict=True))
            placed = int(items[2]) if items[2] else None
            steps.append(KeyStep(int(items[0]), front_of(key, priority, items[3:]), begins, placed))
        return steps

    async def settle(
        self,
        job: str,
        attempt: int,
        key: str,
        priority: int,
        weight: float,
        measured: float | None,
        virtual: int,
        now_ms: int,
    ) -> Settled:
        """A run settled having cost `measured` (cost.measured; None: nothing measured): F corrected, the History
        learnt, once per attempt (fair_settle.lua)."""
        cost = "" if measured is None else repr(float(measured))
        script_keys = keys.cost_keys(key, priority).all
        args = [*self._args(key, priority, weight, virtual), job, attempt, cost, now_ms]
        if self._batch is not None:
            reply = await self._batch.run(self._scripts.fair_settle, script_keys, args)
        else:
            reply = await self._scripts.fair_settle(keys=script_keys, args=args)
        items = _strings(reply)
        applied, delta, at_v, paced, units, seq = items[:6]
        front = front_of(key, priority, items[6:])
        if front is not None:
            front = evolve(front, seq=int(seq))
        return Settled(applied == "1", int(delta), at_v == "1", int(paced), int(units) if units else None, front)

    async def fresh(self, measured: float) -> History:
        """A newcomer's run settled (a run whose grant came from V) having cost `measured`: the newcomers' recent cost
        is learnt (fair_fresh.lua, in the admission state's slot). The newcomers' History."""
        args = [self.settings.mode.value, repr(float(measured))]
        reply = await self._scripts.fair_fresh(keys=[keys.ADMISSION_STATE], args=args)
        average, runs = _strings(reply)
        return History(float(average), int(runs))

    async def read_fresh(self) -> History:
        """The newcomers' History as the last settle of one left it."""
        raw = await self._redis.hget(keys.ADMISSION_STATE, f"fresh:{self.settings.mode.value}")
        average, _, runs = (text(raw) if raw is not None else "0|0").partition("|")
        return History(float(average or 0), int(runs or 0))

    async def waiting(self, job: str) -> bool:
        """Is the job in its partition's line or among its parked jobs?"""
        partition = keys.partition_of(job)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zscore(keys.line(partition), job)
            pipe.zscore(keys.parked(partition), job)
            found = await pipe.execute()
        return any(place is not None for place in found)

    async def charged(self, job: str, key: str) -> bool:
        """Has a grant of the job charged its key a run still in flight (`c:<job>`)?"""
        return bool(await self._redis.hexists(keys.cost_history(key), f"c:{job}"))

    async def charges_in_flight(self, jobs: Sequence[tuple[str, str]]) -> list[bool]:
        """For each (job, its fairness key): has a grant of the job charged its key a run still in flight? (One
        pipeline.)"""
        if not jobs:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for job, key in jobs:
                pipe.hexists(keys.cost_history(key), f"c:{job}")
            return [bool(found) for found in await pipe.execute()]

    async def promote(self, fronts: Sequence[Front], *, move: bool = False) -> list[int]:
        """Place each front in its partition's line (fair_promote.lua, one pipeline): 1 joined, 2 there already (with
        `move`, a settle's correction of its key's turn, moved to its place given unless a later settle of its key
        (a greater `seq`) placed it; a pass's placing, whose key step may have read the key before a settle, leaves
        it where it is), 0 gone (claimed or stopped: its key's step reports it `left`)."""
        calls: list[tuple[Sequence[str], Sequence[str | int]]] = []
        for front in fronts:
            job = front.placed.job
            script_keys = _placing_keys(job)
            args: list[str | int] = [job, front.score, front.entry, keys.SIGNALS, front.message, ""]
            if move:  # a settle's: it moves the front, unless a later settle of its key placed it already
                args[5:] = [signals.joined_message(job), front.seq]
            calls.append((script_keys, args))
        if self._batch is not None and len(calls) == 1:
            return [int(cast(int, await self._batch.run(self._scripts.fair_promote, *calls[0])))]
        return [int(cast(int, reply)) for reply in await run_many(self._redis, self._scripts.fair_promote, calls)]

    async def heads(self, partitions: Sequence[int], depth: int, *, arrived: bool = False) -> dict[int, Heads]:
        """The heads of each partition (line_heads.lua, one pipeline); `arrived`: with their created ms."""
        more = [keys.arrivals] if arrived else []
        calls: list[tuple[Sequence[str], Sequence[str | int]]] = [
            ([keys.line(p), keys.parked(p), keys.fronts(p), *(k(p) for k in more)], [depth]) for p in partitions
        ]
        replies = await run_many(self._redis, self._scripts.line_heads, calls)
        return {p: heads_of(reply) for p, reply in zip(partitions, replies, strict=True)}

    async def unpark(self, partition: int, most: int = 1_000) -> int:
        """Move up to `most` of the partition's parked jobs to its line (before going back to a broker that reads the
        line only, SPEC S4.2); the parked jobs left."""
        reply = await self._scripts.fair_unpark(
            keys=[keys.line(partition), keys.parked(partition), keys.fronts(partition)],
            args=[most, keys.SIGNALS, signals.JOINED],
        )
        return int(cast(int, reply))

    async def key_line(self, key: str, priority: int) -> KeyLine:
        """The key's state as the scripts keep it (a repair slice's and the tests' read; not atomic)."""
        names = keys.cost_keys(key, priority)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.hget(names.lines, key)
            pipe.zscore(names.turns, key)
            pipe.zrange(names.queue, 0, -1)
            raw, idle, queue = await pipe.execute()
        return line_of(None if raw is None else text(raw), idle, tuple(text(job) for job in queue))

    async def key_lines(self, pairs: Sequence[tuple[str, int]]) -> dict[tuple[str, int], KeyLine]:
        """The KeyLines (without their queues) of keys with waiting jobs, by (key, priority): one pipeline."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for key, priority in pairs:
                pipe.hget(keys.cost_keys(key, priority).lines, key)
            raws = await pipe.execute()
        return {pair: line_of(text(raw), None, ()) for pair, raw in zip(pairs, raws, strict=True) if raw is not None}

    async def history(self, key: str) -> History:
        raw = await self._redis.hmget(keys.cost_history(key), ["avg", "n"])
        avg, n = (None if x is None else text(x) for x in raw)
        return History(float(avg or 0), int(n or 0))

    async def charge(self, key: str, job: str) -> Charge | None:
        """What the grant of the job's run in flight charged its key (None: nothing in flight)."""
        raw = await self._redis.hget(keys.cost_history(key), f"c:{job}")
        return None if raw is None else charge_of(key, text(raw))


def _placing_keys(job: str) -> list[str]:
    """fair_promote.lua's KEYS for a front: its partition's line, parked jobs and fronts, and its view."""
    p = keys.partition_of(job)
    return [keys.line(p), keys.parked(p), keys.fronts(p), keys.view(job)]


def entry_tail(key: str, more: int = 0, following: Sequence[str] = ()) -> str:
    """A `fronts` entry after its advance: `|more|next ids|key`."""
    return f"|{more}|{' '.join(following)}|{key}"


def _strings(reply: object) -> list[str]:
    return [text(x) for x in cast(list[object], reply)]


def front_of(key: str, priority: int, items: Sequence[str]) -> Front | None:
    """A key step's front from its reply `front, tag, at_v, advance, paced, more, next ids...` (front '': none)."""
    if not items or not items[0]:
        return None
    job, tag, at_v, advance, paced, more = items[:6]
    placed = Placed(job, int(tag), parked=False, at_v=at_v == "1", advance=int(advance), paced=int(paced))
    return Front(key, priority, placed, int(more), tuple(items[6:]))


def charge_of(key: str, raw: str) -> Charge:
    """A `c:<job>` field: `priority|units|start|at_v|paced|weight|attempt|guessed` (`guessed` absent: not)."""
    priority, units, start, at_v, paced, weight, _, *rest = raw.split("|")
    guessed = rest[:1] == ["1"]
    return Charge(key, int(priority), float(weight), int(units), int(start), at_v == "1", int(paced), guessed)


def line_of(raw: str | None, idle: float | None, queue: tuple[str, ...]) -> KeyLine:
    """A key's KeyLine from its `keys` field (None: idle, its F in `turns` or none) and its queue."""
    if raw is None:
        return KeyLine(finish=None if idle is None else int(idle), queue=queue)
    finish, projected, front, tag, at_v, advance, paced = raw.split("|")
    placed = (
        Placed(front, int(tag), parked=False, at_v=at_v == "1", advance=int(advance), paced=int(paced))
        if front
        else None
    )
    return KeyLine(int(finish), int(projected), front or None, placed, queue)


def heads_of(reply: object) -> Heads:
    """line_heads.lua's reply as Heads."""
    line, parked, entries, *arrivals = cast(list[object], reply)
    read, waiting = scored(line), scored(parked)
    fronts = [
        (job, entry_of(text(raw))) for (job, _), raw in zip(read, cast(list[object], entries), strict=True) if raw
    ]
    arrived: list[tuple[str, float]] = []
    if arrivals:
        at = cast(list[object], arrivals[0])
        arrived = [(job, float(text(ms))) for (job, _), ms in zip([*read, *waiting], at, strict=True) if ms]
    return Heads(tuple(read), tuple(waiting), tuple(fronts), tuple(arrived))


def entry_of(raw: str) -> Entry:
    advance, more, following, key = raw.split("|", 3)
    return Entry(int(advance), int(more), tuple(following.split()), key)
