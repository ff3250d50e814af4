"""Job streams and views: create, fenced append, load, read after an id. The only XADD/XRANGE."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import cast

import orjson
from attrs import frozen
from redis.asyncio import Redis

from broker.admission import fair
from broker.admission.cost import CostMode, CostSettings, Placed
from broker.admission.quotas import Bound
from broker.codec import decode, decode_board, decode_view, encode, encode_board, encode_view, pack
from broker.errors import JobNotFound, LeaseLost, StreamConflict
from broker.events import HermesEventRecorded, JobCreated, JobEvent, JobStatus, RunAccepted
from broker.logging import get_logger
from broker.store import bound as bounds
from broker.store import keys, lean
from broker.store.batch import ScriptBatch
from broker.store.callbacks import CallbackWrite
from broker.store.connection import is_cluster
from broker.store.cost_entry import CostEntry
from broker.store.durability import Durability
from broker.store.entries import Entries, EventFormat
from broker.store.job_write import entering, index_entry, write_script_keys
from broker.store.line_state import read_virtual
from broker.store.outage import is_outage
from broker.store.scripts import Scripts, as_strings, ring_work
from broker.tasks import SharedRead
from projections.board import BoardState
from projections.job import JobView, fold
from projections.usage import Used

START = "0-0"


@frozen
class Snapshot:
    """A job view (and its board fold state) and the stream id they were folded up to."""

    view: JobView
    last_id: str
    board: BoardState | None = None


@frozen
class Created:
    snapshot: Snapshot
    created: bool  #: False: the job already existed (an idempotent replay)


@frozen(kw_only=True)
class BoardWrite:
    """What a write persists of the job's board (SPEC S5.3): the fold state and, if any, a new version."""

    state: BoardState
    report: bytes | None = None  #: the new version's rendered report; None: the events made no version
    at_ms: int = 0
    state_change: bool = False
    expire_at_ms: int = 0  #: sourceActivityAt + HERMES_TTL
    refresh_ms: int = 0  #: BOARD_REFRESH_INTERVAL
    now_ms: int = 0


class JobStore:
    """Reads and writes job streams; every write is one Lua script, one round trip."""

    def __init__(
        self,
        redis: Redis,
        *,
        retention_ms: int,
        hold_ms: int = 2_400_000,
        durability: Durability | None = None,
        packed: bool | None = None,
        delta_retention_ms: int = 0,
        virtual: fair.VirtualTimes | None = None,
        cost: CostSettings | None = None,
    ) -> None:
        """`packed`: pin whether relayed Hermes events are stored packed (None: the store's switch decides);
        `delta_retention_ms`: RUNS_DELTA_RETENTION (0: a job keeps its deltas as long as the rest); `cost`:
        ADMISSION_FAIRNESS_COST (None or `runs`: fixed tags at create)."""
        self._redis = redis
        self._delta_retention_ms = delta_retention_ms
        self._entries = Entries(redis)
        self.format = EventFormat(redis, packed)
        self._virtual = virtual or fair.VirtualTimes()  #: V per priority, shared with the admission passes
        self._refreshing: asyncio.Task[None] | None = None  #: a read of V on its way (creates never wait for it)
        self._first_read: SharedRead[list[int]] = SharedRead()  #: the first read of V, which creates wait for
        self._scripts = Scripts(redis, durability)
        self._cluster = is_cluster(redis)
        self._guard = bounds.ClusterGuard()  #: the bounded line's check before the write, on a cluster (SPEC S4.4)
        #: the writes of a loop turn in one pipeline (broker/store/batch.py): on a single Redis, without WAIT
        self._batch = ScriptBatch(redis) if not self._cluster and not self._scripts.durability.replicas else None
        self._retention_ms = retention_ms
        self._hold_ms = hold_ms  # a job still waiting in the line by then is woken to expire (RUNS_HOLD)
        #: cost-aware fair shares (SPEC S4.2 "What a turn costs"): a key's jobs queue behind its front
        self._cost = (
            None
            if cost is None or cost.mode is CostMode.RUNS
            else CostEntry(redis, cost, retention_ms, batch=self._batch)
        )

    async def create(
        self,
        event: JobCreated,
        view: JobView,
        board: BoardWrite | None = None,
        bound: Bound | None = None,
        held: bounds.Counted = (0, 0),
    ) -> Created:
        """Store `event` and its view, put the job in the admission line and tell every replica (`line J`),
        unless the job id exists already. Its place in the line is its start tag in its fairness key's turn
        (SPEC S4.2): on a cluster taken first, in the key's partition (a replayed create takes a turn it does not
        use); on a single Redis inside the job write. Raise QueueFull, storing nothing, when the job would pass a
        waiting `bound` (SPEC S4.4; broker/store/bound.py), counting `held` (jobs of its key, and in all, waiting out of
        the line: held by their quotas) besides the line."""
        if not bound or not self._cluster:
            return await self._create(event, view, board, bound, held)
        # before the turn: a refused create takes none
        fairness_key, parked = view.scheduling.fairness_key, self._cost is not None
        async with self._guard.checked(self._redis, event.job_id, fairness_key, bound, parked=parked) as counted:
            return await self._create(event, view, board, bound, (counted[0] + held[0], counted[1] + held[1]))

    async def _create(
        self, event: JobCreated, view: JobView, board: BoardWrite | None, bound: Bound | None, counted: bounds.Counted
    ) -> Created:
        turn, args = await self._turn(view, event.at_ms)
        place, newcomer, placed = None, False, None
        if self._cost is not None and self._cluster:  # the key's queue first, in its partition
            placed = await self._cost.enter(event.job_id, view, int(args[1]))
        elif self._cluster:
            reply = await self._scripts.fair_turn(keys=[turn], args=args)
            tag = int(reply.decode() if isinstance(reply, bytes) else reply)
            place, newcomer = fair.score(view.scheduling.priority, tag), tag == args[1]
        reply = await self._write(
            event.job_id,
            [event],
            view,
            expected="$new",
            due_at=event.at_ms + self._hold_ms,
            board=board,
            place=place,
            turn=None if self._cluster or self._cost else (turn, args),
            newcomer=newcomer,
            bound=(bound, counted) if bound else None,
            placed=placed,
            virtual=int(args[1]),
        )
        if reply[0] == "FULL" and bound is not None:
            if placed is not None and self._cost is not None:  # nothing stored: it leaves the key queue it joined
                await self._cost.left(event.job_id, view, int(args[1]))
            raise bounds.refused(bound, reply[1], view.scheduling.fairness_key)
        if reply[0] == "OK":
            if self._cluster:  # the doorbells (hints: the line is looked at anyway) are other slots there
                await self._ring_board(event.job_id, board)  # first: the created version goes out before the run
                # `line J` reaches a replica through other nodes, out of creation order: the doorbells, read in
                # order, ring the passes (broker/driver/supervisor.py)
                await ring_work(self._redis, {"line": event.job_id})
            return Created(Snapshot(view, reply[1], board.state if board else None), created=True)
        existing = decode_view(reply[1]) or (await self.load(event.job_id) or await self._refold(event.job_id)).view
        if placed is not None and self._cost is not None and not await self._cost.waits(existing):
            # granted or past its wait: the replay's turn queued it in its key's queue again, where it no longer waits
            await self._cost.left(event.job_id, existing, int(args[1]))
        return Created(Snapshot(existing, ""), created=False)

    async def warm(self, now_ms: int) -> None:
        """Read what a create goes by (the line's virtual time, the store's event format) before the first create
        comes: a create that waits for a read after its request arrived may be overtaken by later ones, and take its
        place in the line after theirs."""
        try:
            self._virtual.learn(await self._first_read(lambda: read_virtual(self._redis)), now_ms)
            await self.format.packed()
            if self._cost is not None:
                await self._cost.warm(now_ms)
        except Exception as error:  # the first creates read them (a cluster node down at start: serve anyway)
            if not is_outage(error):
                raise
            get_logger(type(self)).warning(
                "Could not read what creates go by yet: the first creates read it.", exc_info=error
            )

    async def _turn(self, view: JobView, now_ms: int) -> tuple[str, list[str | int]]:
        """The turns key of a new job's fairness key and priority, and fair_turn.lua's ARGV for it."""
        scheduling = view.scheduling
        if self._virtual.learnt_at_ms is None:  # the first creates of this replica: nothing to go by yet
            # one read for every create until it is back: they go on in the order they came
            self._virtual.learn(await self._first_read(lambda: read_virtual(self._redis)), now_ms)
        elif self._virtual.stale(now_ms) and self._refreshing is None:  # no admission pass brought V lately
            # Read behind the create's back: a write that waited for it would land after later creates' writes
            # and take a later turn (a stale V only favours newcomers a little)
            self._refreshing = asyncio.create_task(self._refresh_virtual(now_ms))
        key = keys.turns(keys.fairness_partition(scheduling.fairness_key), scheduling.priority)
        virtual = self._virtual.tag(scheduling.priority)
        return key, [scheduling.fairness_key, virtual, fair.advance(scheduling.fairness_weight), fair.MAX_TAG]

    async def _refresh_virtual(self, now_ms: int) -> None:
        try:
            self._virtual.learn(await read_virtual(self._redis), now_ms)
        except Exception as error:  # a task of its own: nobody awaits it, so nothing may escape
            if not is_outage(error):  # an outage: the next create past the refresh interval tries again
                get_logger(type(self)).error("Could not refresh the line's virtual time.", exc_info=error)
        finally:
            self._refreshing = None

    async def append(
        self,
        job_id: str,
        events: Sequence[JobEvent],
        view: JobView,
        *,
        expected_last_id: str | None,
        lease_token: str | None = None,
        board: BoardWrite | None = None,
        due_at: int | None = None,
        before: JobView | None = None,
        release: bool = False,
        callback: CallbackWrite | None = None,
        usage: Sequence[tuple[int, bytes]] = (),
    ) -> list[str]:
        """Append `events` with `view` (their fold); raise StreamConflict, LeaseLost or JobNotFound.

        `due_at`: the job's next wake-up in the due schedule, set in the same write; `before`: the view the
        events were folded onto (its listing entry then moves only when the status or updated_at changed);
        `release`: when the write ends the job, `lease_token`'s run lease is released in it too (as
        Leases.release(due_at_ms=None) would); `callback`: the callback deliveries the events owe (SPEC S5.8);
        `usage`: (when, fact) of what the events add to their key's usage (SPEC S4.5), kept in the job's partition
        until the usage sweep counts them."""
        reply = await self._write(
            job_id,
            events,
            view,
            expected=expected_last_id or "",
            token=lease_token,
            board=board,
            due_at=due_at,
            before=before,
            release=release,
            callback=callback,
            usage=usage,
        )
        match reply[0]:
            case "OK":
                if self._cluster:
                    await self._ring_board(job_id, board)
                if self._cost is not None:  # its key's queue, or its run's charge corrected (SPEC S4.2)
                    await self._cost.written(view, before, usage, self._virtual.settling(view.scheduling.priority))
                return reply[1:]
            case "CONFLICT":
                raise StreamConflict(job_id, reply[1])
            case "FENCED":
                raise LeaseLost(job_id)
            case _:
                raise JobNotFound(job_id)

    async def _write(
        self,
        job_id: str,
        events: Sequence[JobEvent],
        view: JobView,
        *,
        expected: str,
        token: str | None = None,
        due_at: int | None = None,
        board: BoardWrite | None = None,
        before: JobView | None = None,
        place: int | None = None,
        turn: tuple[str, list[str | int]] | None = None,
        newcomer: bool = False,
        release: bool = False,
        callback: CallbackWrite | None = None,
        bound: tuple[Bound, bounds.Counted] | None = None,
        usage: Sequence[tuple[int, bytes]] = (),
        placed: Placed | None = None,
        virtual: int = 0,
    ) -> list[str]:
        """One append_events.lua over the job's partition (one slot; on a single Redis also the turns of a new
        job's fairness key, `turn`); acknowledged after WAIT when asked. On a single Redis a create's only wake-up
        is the `line J` message its write publishes (broker/store/signals.py): every replica hears it, in creation
        order, and looks at the line."""
        write: dict[str, object] = {
            "job": job_id,
            "expect": expected,
            "token": token or "",
            "retention": str(self._retention_ms),
            "statuses": str(len(JobStatus)),
        }
        index = index_entry(keys.partition_of(job_id), view, before, created=expected == "$new")
        if index is not None:
            write["index"] = index
        if due_at is not None:
            write["due"] = str(due_at)
        if expected == "$new":
            self._entering(write, job_id, view, place, turn, newcomer, placed, virtual)
        elif view.status.terminal:
            write.update({"line": "leave"} if self._cost is None else {"line": "leave", "cost": {}})
        ends = view.status.terminal and not (before and before.status.terminal)
        if ends:
            write.update(self._ending(view, release=release and bool(token)))
        if expected == "$new" or ends:
            write["compact"] = "1"  # the stream goes quiet: give back Redis's reserve at its end
        state, report = b"", b""
        if board is not None:
            state, report = encode_board(board.state), board.report or b""
            if board.report is not None:
                write["board"] = {
                    "at": str(board.at_ms),
                    "change": "1" if board.state_change else "0",
                    "expire": str(board.expire_at_ms),
                    "refresh": str(board.refresh_ms),
                    "now": str(board.now_ms),
                }
        stored = await self._stored(job_id, events, view)
        runs = {
            keys.run_field(event.attempt): event.hermes_run_id
            for event, data in zip(events, stored, strict=True)
            if isinstance(event, RunAccepted) or (isinstance(event, HermesEventRecorded) and data.startswith(b"["))
        }
        if runs:  # what packed entries leave out, kept once in the view hash (broker/store/entries.py)
            write["runs"] = [item for field_run in runs.items() for item in field_run]
        script_keys = write_script_keys(job_id, write, turn, callback, bound, usage, cluster=self._cluster)
        args = [orjson.dumps(write), encode_view(view), state, report, *stored]
        if self._batch is not None:
            return as_strings(await self._batch.run(self._scripts.append_events, script_keys, args))
        return as_strings(await self._scripts.run(self._scripts.append_events, keys=script_keys, args=args))

    def _entering(
        self,
        write: dict[str, object],
        job_id: str,
        view: JobView,
        place: int | None,
        turn: tuple[str, list[str | int]] | None,
        newcomer: bool,
        placed: Placed | None,
        virtual: int,
    ) -> None:
        """The fields of a create's write that put the job in the line: at its place, taking its key's turn, or
        (cost-aware) as its key's front or parked, as `placed` says or, on a single Redis, as the write decides."""
        write.update(entering(job_id, view, place, turn, newcomer=newcomer))
        if placed is not None:
            CostEntry.fields(job_id, view, placed, write)
        elif self._cost is not None:
            self._cost.turn(job_id, view, virtual, write)

    def _ending(self, view: JobView, *, release: bool) -> dict[str, str]:
        """The fields of the write that ends the job."""
        fields = {"expire": "1"}  # retention runs from the job's end, never while it lives (SPEC S3.6)
        if 0 < self._delta_retention_ms < self._retention_ms:  # deltas serve live readers (S3.6)
            fields["deltas"] = str(view.updated_at_ms + self._delta_retention_ms)
        if release:
            fields["release"] = "1"  # the driver's lease goes with it
        return fields

    async def _stored(self, job_id: str, events: Sequence[JobEvent], view: JobView) -> list[bytes]:
        """The entries of `events`: relayed Hermes events of the job's accepted run packed (broker/codec.py) when
        the store's switch allows it, everything else in full."""
        packing = await self.format.packed() and view.hermes_run_id is not None
        stored: list[bytes] = []
        for event in events:
            data = None
            if (
                packing
                and isinstance(event, HermesEventRecorded)
                and (event.job_id, event.attempt, event.hermes_run_id)
                == (job_id, view.accepted_attempt, view.hermes_run_id)
            ):
                data = pack(event)
            stored.append(data or encode(event))
        return stored

    async def _ring_board(self, job_id: str, board: BoardWrite | None) -> None:
        """On a cluster the board senders poll the 64 outboxes; a new version wakes them at once (a hint)."""
        if board is not None and board.report is not None:
            await self._redis.xadd(keys.BOARD_BELL, {"job": job_id}, maxlen=1_000, approximate=True)

    async def load(self, job_id: str) -> Snapshot | None:
        """The stored view, refolded from the stream when this replica cannot decode it."""
        return await self.snapshot_of(job_id, cast(dict[str, str], await self._redis.hgetall(keys.view(job_id))))

    async def settle_missed(self, facts: Sequence[Used]) -> None:
        """Settle the runs that `facts` (usage facts of settled runs, read by the usage sweep) settle whose charge is
        still in flight (SPEC S4.2 "What a turn costs"): the settle that follows a run's job write was lost to a crash
        or an outage between the two round trips. fair_settle.lua settles an attempt once, whoever comes first."""
        if self._cost is not None:
            await self._cost.missed(facts, self.views, self._virtual.settling)

    async def views(self, job_ids: Sequence[str]) -> list[JobView | None]:
        """The stored views of several jobs, in one pipeline (None: none, or unreadable by this replica)."""
        return await lean.read_views(self._redis, job_ids) if job_ids else []

    async def snapshot_of(self, job_id: str, stored: dict[str, str]) -> Snapshot | None:
        """The snapshot in the fields of a job's view hash (None: no view); refolded when undecodable."""
        if not stored:
            return None
        view = await lean.read_view(self._redis, job_id, stored)  # `state`, or a lean view and its terminal entry
        if view is None:
            return await self._refold(job_id)
        board = decode_board(stored["board"]) if "board" in stored else None
        return Snapshot(view, stored.get("last_id", START), board)

    async def execution_body(self, job_id: str, created: str | None = None) -> str:
        """The body Hermes gets (SPEC S3.1): kept once, in the job's JobCreated, the first entry of its stream
        (`created`: that event's JSON, when it was read already)."""
        return (await self.created_event(job_id, created)).body

    async def created_event(self, job_id: str, created: str | None = None) -> JobCreated:
        """The job's JobCreated, the first entry of its stream (`created`: its JSON, when it was read already)."""
        if created is not None:
            event: JobEvent | None = decode(created)
        else:
            event = next((first for _, first in await self.read(job_id, count=1)), None)
        if not isinstance(event, JobCreated):
            raise JobNotFound(job_id)
        return event

    async def traceparent(self, job_id: str) -> str | None:
        """The job's stored trace context (SPEC S6.1); None for an unknown job or one created untraced."""
        try:
            return (await self.created_event(job_id)).traceparent
        except JobNotFound:
            return None

    async def read(self, job_id: str, after: str = START, count: int | None = None) -> list[tuple[str, JobEvent]]:
        """Events strictly after `after`, oldest first."""
        entries = await self._redis.xrange(keys.events(job_id), min=f"({after}", max="+", count=count)
        return await self._entries.events(job_id, _entries(entries))

    async def job_ids(self) -> AsyncIterator[str]:
        """Every stored job (SCAN over event streams): for tools such as the projection rebuild."""
        async for key in self._redis.scan_iter(match=keys.EVENTS_MATCH, count=500):
            job_id = keys.job_id_of(key)
            if job_id:
                yield job_id

    async def _refold(self, job_id: str) -> Snapshot:
        history = await self.read(job_id)
        view = fold(event for _, event in history)
        if view is None:
            raise JobNotFound(job_id)
        return Snapshot(view, history[-1][0])


def _entries(reply: object) -> list[tuple[str, dict[str, str]]]:
    # redis-py types stream replies loosely; with decode_responses=True they are str pairs.
    return cast(list[tuple[str, dict[str, str]]], reply)
