"""Claims work for this replica, runs one Runner per job under its lease, takes over, drains.

Ownership is the run lease. The work stream is a doorbell, a hint only (read through the `drivers` group
and acknowledged at once): `line` rings the admission pass, which grants slots to the heads of the partition
lines in arrival order (SPEC S4.1); `job` names a job to look at now. A create's write publishes `line J`, which
every replica hears: it makes J's partition known. On a single Redis the messages come in creation order, so
the message itself rings the pass (at once, unless a pass began less than JOIN_LINGER_S ago: then that long after
it began, so the creates of a burst share one pass) and a create rings no doorbell; on a cluster they reach a
replica through other nodes, out of order, so there the create's `line` doorbell, read in creation order, rings
it (brokers before this version ring one on a single Redis too). The partitioned due schedules and lines are the
memory: the admission pass runs every ADMIT_TICK_S and the promote loop every second without a doorbell, so a
lost doorbell or message only delays. A job whose owner died becomes due when its lease would have been renewed,
is promoted (a `job` doorbell) and taken over; a job waiting in the line is due when its hold expires.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import cast

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from broker.admission.state import line_place
from broker.driver import handback
from broker.driver.deps import Deps, Ending
from broker.driver.prober import Prober
from broker.driver.runner import Runner
from broker.errors import JobNotFound, LeaseLost, NotReplicated
from broker.ids import new_replica_id
from broker.logging import get_logger
from broker.store import keys, signals, work
from broker.store.connection import is_cluster
from broker.store.grants import Grant
from broker.store.leases import Leases, new_token
from broker.store.outage import is_outage, log_failure
from broker.tasks import cancel_all

CLAIM_BLOCK_MS = 1_000
RETRY_AFTER_FAILURE_MS = 1_000
MAX_REDIS_BACKOFF_S = 5.0
#: The line is also looked at this often without a doorbell (a replica that rang it may have died).
ADMIT_TICK_S = 2.0
#: The latest a job held by its key's quota (SPEC S4.4) is looked at by its schedule: a backstop, the quota's wake
#: returns it to the line.
HELD_RECHECK_MS = 600_000
#: Jobs that joined the line ring at most one pass per this long: a burst of creates costs a pass per
#: JOIN_LINGER_S, not one each (a pass at Hermes's limit still costs a round trip), and a job waits at most this for
#: its pass (a lone create none).
JOIN_LINGER_S = 0.01
#: A drain waits at most this long for Hermes's answers to the creates on their way (SHUTDOWN_GRACE bounds it too).
DRAIN_WAIT_S = 10.0


class Supervisor:
    def __init__(
        self, redis: Redis, deps: Deps, *, concurrency: int, replica: str = "", drain_wait_s: float = DRAIN_WAIT_S
    ) -> None:
        self._drain_wait_s = drain_wait_s  #: how long a drain waits for Hermes to answer creates on their way
        self.replica = replica or new_replica_id()
        self._redis = redis
        self._deps = deps
        self._leases: Leases = deps.leases
        self._concurrency = concurrency
        self._runners: dict[str, tuple[Runner, asyncio.Task[None]]] = {}
        self._lost: set[str] = set()
        fleet = deps.fleet
        #: the upstreams' health: reports, probes, orphans (SPEC S10)
        self._prober = (
            Prober(fleet, deps.gate.store.health, lost_ms=deps.gate.store.pacing.upstream_lost_ms)
            if fleet is not None and len(fleet) > 0
            else None
        )
        self._freed = asyncio.Event()
        #: whether `line J` messages ring the pass: on a single Redis they come in creation order; on a cluster
        #: they come through other nodes, out of order, and the creates' `line` doorbells ring it instead
        self._joins_ring = not is_cluster(redis)
        self._line_bell = asyncio.Event()
        self._joining: asyncio.TimerHandle | None = None  #: the pass rung for jobs heard to join, on its way
        self._passed_at = -JOIN_LINGER_S  #: when the last admission pass began (the loop's clock, seconds)
        #: while Hermes refuses, the next probe's time (epoch ms) as the last pass found it: a job that joins before
        #: it cannot be granted (the pass then wakes at that time itself, and a slot that comes back rings it)
        self._refusing_until = 0
        self._loops: list[asyncio.Task[None]] = []
        self._log = get_logger(type(self))

    @property
    def active(self) -> int:
        return len(self._runners)

    def ring(self) -> None:
        """Look at the admission line now (a slot came back, the limit grew, a job joined)."""
        self._line_bell.set()

    def joined(self) -> None:
        """A job joined the line: look at it now, or JOIN_LINGER_S after the last pass began (a burst shares one)."""
        if self._joining is not None or self._deps.clock.now_ms() < self._refusing_until:
            return
        loop = asyncio.get_running_loop()
        wait_s = self._passed_at + JOIN_LINGER_S - loop.time()
        if wait_s <= 0:
            self.ring()
        else:
            self._joining = loop.call_later(wait_s, self._rang_for_joins)

    def _rang_for_joins(self) -> None:
        self._joining = None
        self.ring()

    def start(self) -> None:
        loops = [self._claim_loop, self._admit_loop, self._promote_loop, self._renew_loop, self._nudge_loop]
        if self._prober is not None:
            loops.append(self._health_loop)
        for loop in loops:
            self._loops.append(asyncio.create_task(self._guarded(loop), name=f"{loop.__name__}"))

    async def drain(self) -> int:
        """Stop taking work and hand every driven job back for immediate takeover; Hermes runs go on."""
        await cancel_all(self._loops)
        if self._joining is not None:
            self._joining.cancel()
            self._joining = None
        owned = list(self._runners.values())
        await cancel_all(task for _, task in owned)
        # the jobs whose creates are not on their way go back at once; each of the others once its answer is recorded
        waiting = [runner for runner, _ in owned if runner.unrecorded is not None]
        handed = await handback.hand_back(self._deps, [runner for runner, _ in owned if runner.unrecorded is None])
        if waiting:
            wait_s = self._drain_wait_s
            answers = await asyncio.gather(*(handback.when_answered(self._deps, runner, wait_s) for runner in waiting))
            handed += sum(back for back, _ in answers)
            recorded = sum(was for _, was in answers)
            self._log.info(
                "Recorded runs created while draining.", extra={"waited": len(waiting), "recorded": recorded}
            )
        self._log.info("Handed jobs back on shutdown.", extra={"replica": self.replica, "jobs": handed})
        return handed

    async def _guarded(self, loop: Callable[[], Awaitable[None]]) -> None:
        """Keep a background loop alive through Redis outages (log, back off, go on)."""
        delay = 0.1
        while True:  # a loop that ends (a pub/sub connection that closed) starts again too
            try:
                await loop()
            except Exception as error:  # the loops' guard: an outage is expected, anything else a bug
                log_failure(
                    self._log, error, outage="Lost Redis in a driver loop.", bug="A driver loop failed.", retryS=delay
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_REDIS_BACKOFF_S)

    async def _claim_loop(self) -> None:
        await work.ensure_group(self._redis)
        while True:
            free = self._concurrency - len(self._runners)
            if free <= 0:
                self._freed.clear()
                await self._freed.wait()
                continue
            try:
                reply = await self._redis.xreadgroup(
                    keys.WORK_GROUP, self.replica, {keys.WORK: ">"}, count=free, block=CLAIM_BLOCK_MS
                )
            except ResponseError as error:
                if "NOGROUP" not in str(error):
                    raise
                await work.ensure_group(self._redis)  # the stream or group was lost (Redis without AOF)
                continue
            entries = [
                (entry_id, fields)
                for _, batch in cast(list[tuple[str, list[tuple[str, dict[str, str]]]]], reply or [])
                for entry_id, fields in batch
            ]
            if not entries:
                continue
            ids = [entry_id for entry_id, _ in entries]
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.xack(keys.WORK, keys.WORK_GROUP, *ids)
                pipe.xdel(keys.WORK, *ids)
                await pipe.execute()
            joined = [fields["line"] for _, fields in entries if "line" in fields]
            if joined:
                for job_id in joined:
                    self._deps.gate.heard(job_id)
                self.ring()
            for job_id in dict.fromkeys(fields.get("job", "") for _, fields in entries):
                if job_id:
                    await self._claim(job_id)

    async def _admit_loop(self) -> None:
        """Grant this replica's free runner slots to the head of the line, whenever it may have moved."""
        wake_at: int | None = None
        while True:
            timeout = ADMIT_TICK_S
            if wake_at is not None:
                timeout = min(timeout, max(0.0, (wake_at - self._deps.clock.now_ms()) / 1000))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._line_bell.wait(), timeout)
            self._line_bell.clear()
            free = self._concurrency - len(self._runners)
            if free <= 0:
                continue  # a runner that ends rings the bell
            self._passed_at = asyncio.get_running_loop().time()
            now = self._deps.clock.now_ms()
            grants = await self._deps.gate.admit(now, free)
            wake_at = grants.wake_at_ms
            self._refusing_until = (wake_at or 0) if not grants.grants else 0
            if grants.more:
                self.ring()  # slots went unused (jobs held by their quotas): the next jobs in line may take them
            for grant in grants.grants:  # each came with its run lease (admission_claim.lua)
                if not grant.held:  # a held one waits out of the line (SPEC S4.4): its lease goes back below
                    self._start(  # one routed nowhere (it waits for its busy upstream) goes back in line
                        grant.job_id,
                        grant.token,
                        admitted=grant.upstream is not None,
                        stored=grant.stored,
                        created=grant.created,
                        upstream=grant.upstream,
                        moved=(grant.moved_from, grant.moved_because or "") if grant.moved_from else None,
                        place=grant.place,
                        waited_until=grant.waited_until_ms,
                    )
            await self._hand_back_held([grant for grant in grants.grants if grant.held], now)

    async def _hand_back_held(self, grants: list[Grant], now_ms: int) -> None:
        """Give up the leases of jobs a pass held for their keys' quotas (SPEC S4.4): the quota's wake returns them to
        the line; their schedule looks at them again after HELD_RECHECK_MS at the latest. A lease not given back
        (Redis failed) lapses by itself (RUNS_LEASE)."""
        due = now_ms + max(self._deps.policy.hold_ms, HELD_RECHECK_MS)
        outcomes = await asyncio.gather(
            *(self._leases.release(grant.job_id, grant.token, due_at_ms=due) for grant in grants),
            return_exceptions=True,
        )
        for grant, outcome in zip(grants, outcomes, strict=True):
            if isinstance(outcome, Exception):
                log_failure(self._log, outcome, outage="", bug="Could not hand a held job back.", job=grant.job_id)

    async def _claim(self, job_id: str) -> bool:
        """Start a runner for the job under a new lease; False when it is driven already."""
        if job_id in self._runners:
            self._runners[job_id][0].nudge()
            return False
        token = new_token(self.replica)
        if not await self._leases.acquire(job_id, token, self._deps.clock.now_ms()):
            return False  # another replica drives it
        self._start(job_id, token, admitted=False)
        return True

    def _start(
        self,
        job_id: str,
        token: str,
        *,
        admitted: bool,
        stored: dict[str, str] | None = None,
        created: str | None = None,
        upstream: str | None = None,
        moved: tuple[str, str] | None = None,
        place: str | None = None,
        waited_until: int = 0,
    ) -> None:
        self._log.debug("Acquired a run lease.", extra={"job": job_id, "replica": self.replica})
        runner = Runner(
            job_id,
            token,
            self._deps,
            admitted=admitted,
            stored=stored,
            created=created,
            upstream=upstream,
            moved=moved,
            place=place,
            waited_until=waited_until,
        )
        task = asyncio.create_task(self._run(runner), name=f"runner-{job_id}")
        self._runners[job_id] = (runner, task)

    async def _run(self, runner: Runner) -> None:
        job_id = runner.job_id
        due_at: int | None = None
        try:
            ending = await runner.run()
        except asyncio.CancelledError:
            if job_id not in self._lost:
                raise  # a drain: the drain hands the job back
            ending = Ending.LOST
        except LeaseLost:
            ending = Ending.LOST
        except JobNotFound:
            ending = Ending.FINISHED
        except NotReplicated as error:  # REDIS_WAIT_REPLICAS unmet (a failover): the transition is retried soon
            extra = {"job": job_id, "acknowledged": error.acknowledged, "wanted": error.wanted}
            self._log.warning("A job write was not replicated in time.", extra=extra)
            ending, due_at = Ending.PARKED, self._deps.clock.now_ms() + RETRY_AFTER_FAILURE_MS
        except Exception as error:  # the runner's loop guard: log, and let the job be retried soon (SPEC S9)
            log_failure(
                self._log, error, outage="Lost Redis while driving a job.", bug="A job's runner failed.", job=job_id
            )
            ending, due_at = Ending.PARKED, self._deps.clock.now_ms() + RETRY_AFTER_FAILURE_MS
        finally:
            self._runners.pop(job_id, None)
            self._lost.discard(job_id)
            self._freed.set()
            self.ring()  # a runner slot is free here: the line may move
        checked = await handback.still_its_own(self._deps, runner, ending)
        if checked is not None:  # None: Redis out of reach; its lease and its slot expire, the schedule retries it
            await self._finish(runner, checked, due_at)

    async def _finish(self, runner: Runner, ending: Ending, due_at: int | None) -> None:
        if ending is Ending.LOST:
            self._log.warning("Lost a job's run lease.", extra={"job": runner.job_id, "replica": self.replica})
            self._leases.forget(runner.job_id, runner.token)
            await handback.let_go_if_ended(self._deps, runner)
            return
        job_id, gate = runner.job_id, self._deps.gate
        try:
            if ending in (Ending.PARKED_FOR_SESSION, Ending.SETTLING):  # out of the line; its slot goes to the next job
                if runner.has_slot:
                    await gate.release(job_id, freed=False, upstream=runner.slot_upstream)
                due_at = runner.recheck_at
            elif ending is Ending.HELD:
                due_at = self._deps.clock.now_ms() + max(self._deps.policy.hold_ms, HELD_RECHECK_MS)
            elif ending is Ending.QUEUED and runner.queued is not None:
                await gate.enter(job_id, runner.queued.place)  # normally there already (jobs of an older broker)
                due_at = runner.queued.deadline_ms  # woken then to expire, unless granted before
            elif runner.has_slot and ending is Ending.FINISHED:
                await gate.release(job_id, freed=runner.ran, upstream=runner.slot_upstream)
            elif runner.has_slot and not runner.ran and runner.view is not None:
                await gate.requeue(job_id, line_place(runner.view), upstream=runner.slot_upstream)  # keeps its place
            await self._leases.release(job_id, runner.token, due_at_ms=due_at)
            if ending is Ending.SETTLING and due_at is not None:  # its end took it off the schedule: back on it
                await self._leases.wake(job_id, due_at)
            self._log.debug("Released a run lease.", extra={"job": job_id, "ending": ending.value})
        except Exception as error:  # an outage (a connection torn down in a failover too): the lease expires and
            if not is_outage(error):  # the schedule retries; anything else is a bug, logged with its traceback
                log_failure(self._log, error, outage="", bug="Could not hand a job back.", job=job_id)

    async def _promote_loop(self) -> None:
        interval = min(1.0, self._leases.lease_ms / 3000)
        while True:
            await self._leases.promote_due(self._deps.clock.now_ms())
            await asyncio.sleep(interval)

    async def _renew_loop(self) -> None:
        interval = self._leases.lease_ms / 3000
        while True:
            await asyncio.sleep(interval)
            now = self._deps.clock.now_ms()
            slots: dict[str | None, list[str]] = {}  # per upstream (SPEC S10): one write each
            for job_id, (runner, _) in self._runners.items():
                if runner.has_slot:
                    slots.setdefault(runner.slot_upstream, []).append(job_id)
            # the leases first: a slot's renewal that a full Redis refuses does not let them lapse
            driven = list(self._runners.items())
            held = await self._leases.renew_many([(job_id, runner.token) for job_id, (runner, _) in driven], now)
            for (job_id, entry), renewed in zip(driven, held, strict=True):  # one round trip for all leases
                # a runner that finished while the renewal was on its way released its lease itself: not lost
                if not renewed and self._runners.get(job_id) is entry:
                    self._lost.add(job_id)
                    entry[1].cancel()
            for upstream, ids in slots.items():
                await self._deps.gate.hold(ids, now, renew_only=True, upstream=upstream)

    async def _health_loop(self) -> None:
        assert self._prober is not None
        await self._prober.run(self._deps.clock)

    async def _nudge_loop(self) -> None:
        # A job that joined the line while this replica was not listening is seen by the pass this rings.
        async for message in signals.nudges(self._redis, subscribed=self.ring):
            job_id = signals.joined(message)
            if job_id is not None:  # a create (or a job put back in line): every replica's pass looks at it
                entered = signals.newcomer(message)
                self._deps.gate.heard(job_id, None if entered is None else entered[1:])
                if self._joins_ring:
                    self.joined()
                continue
            entry = self._runners.get(message)
            if entry is not None:
                entry[0].nudge()


def _stream_reply(reply: object) -> list[tuple[str, list[tuple[str, dict[str, str]]]]]:
    # redis-py types XREADGROUP loosely; with decode_responses=True it is [[stream, [(id, fields)]]].
    return cast(list[tuple[str, list[tuple[str, dict[str, str]]]]], reply or [])
