"""One asyncio task per driven job: it executes decide()'s actions and appends what Hermes answered: its wait for
its quota and its session, its create and the answer's record; its live run is followed (`following.py`)."""

from __future__ import annotations

import asyncio

from broker import tracing
from broker.admission.state import line_place
from broker.driver import decide, forsaken
from broker.driver.decide import Append, Done, Follow, Queue, StopRun, Submit
from broker.driver.deps import Deps, Ending
from broker.driver.follow_span import FollowSpan
from broker.driver.following import Following
from broker.driver.pump import Pump
from broker.errors import LeaseLost
from broker.events import JobCreated, JobEvent, JobRerouted
from broker.hermes.models import Accepted, CreateOutcome
from broker.jobs.conversation import ANSWER_RECHECK_MS, recheck_at, waits
from broker.store.jobs import Snapshot
from broker.store.outage import is_outage, outage_name
from projections.job import JobView


class Runner(Following):
    """Drives one job; `admitted`: it was granted an admission slot, so it may create the job's run."""

    def __init__(
        self,
        job_id: str,
        token: str,
        deps: Deps,
        *,
        admitted: bool = False,
        stored: dict[str, str] | None = None,
        created: str | None = None,
        upstream: str | None = None,
        moved: tuple[str, str] | None = None,
        place: str | None = None,
        waited_until: int = 0,
    ) -> None:
        super().__init__(job_id, token, deps, admitted=admitted, upstream=upstream)
        self._place = place  #: where the job was in the line when granted (None: not granted from it)
        #: when its turn of its session began (SPEC S4.3), or its wait for its key's quota ended (S4.4): its wait for
        #: Hermes (RUNS_HOLD) counts from then
        self._turn_since = waited_until
        self.recheck_at: int | None = None  #: set when it ends PARKED_FOR_SESSION: when it looks again
        self._moved = moved  #: (from, reason): its session moved to `upstream` (SPEC S10), recorded before the create
        self.ran = False  #: a run of the job was live on Hermes under this slot (its release frees capacity)
        self.queued: Queue | None = None  #: set when the run ends QUEUED
        #: a create whose answer this runner stopped waiting for (or recording) when it was cancelled
        self.unrecorded: forsaken.Unrecorded | None = None
        self.view: JobView | None = None  #: the job as last seen
        self._stored = stored  #: the job's view hash as read with the grant (None: read it first)
        self._created_json = created  #: its JobCreated JSON as read with the grant (None: read it when submitting)
        self._job: JobCreated | None = None  #: the job's JobCreated (its body, its trace context), once read
        self._follow_span = FollowSpan(lambda: self.view.status.value if self.view is not None else None)

    async def run(self) -> Ending:
        # Every span of this task is a child of the create's span, stored with the job (SPEC S6.1).
        parent = (await self._created()).traceparent if tracing.enabled() else None
        with tracing.within(parent, {tracing.JOB: self.job_id}):
            try:
                return await self._drive()
            finally:
                if self._pump is not None:
                    await self._pump.close()
                self._follow_span.end()

    async def _drive(self) -> Ending:
        store = self._deps.writer.store
        stored, self._stored = self._stored, None
        snapshot = await (store.load(self.job_id) if stored is None else store.snapshot_of(self.job_id, stored))
        if snapshot is None:
            return Ending.FINISHED
        await self._announce(snapshot.view)
        waits = await self._waits(snapshot.view)
        if waits is not None:
            return waits
        while True:
            view = self.view = snapshot.view
            now = self._deps.clock.now_ms()
            stop_sent = self._stop_sent_attempt == view.attempt
            action = decide.next_action(
                view,
                now,
                stop_sent=stop_sent,
                admitted=self.has_slot,
                policy=self._deps.policy,
                turn_since_ms=self._turn_since,
            )
            match action:
                case Done():
                    self._follow_span.end()
                    if self.has_slot:  # at once, before the stream closes: the next job in line goes now
                        await self._deps.gate.release(self.job_id, freed=self.ran, upstream=self.slot_upstream)
                        self.has_slot = False
                    await self._remember_session(view)  # RUNS_RETENTION after its last job
                    conversations, now = self._deps.conversations, self._deps.clock.now_ms()
                    if conversations is not None and not await conversations.ended(view, now):
                        self.recheck_at = now + ANSWER_RECHECK_MS
                        return Ending.SETTLING
                    return Ending.FINISHED  # the next turn of its session goes now
                case Append(events=events):
                    snapshot = await self._append_decided(snapshot, list(events))
                case Queue():
                    self.queued = action
                    return Ending.QUEUED
                case Submit():
                    snapshot = await self._submit(snapshot, action)
                case StopRun(hermes_run_id=run_id):
                    snapshot = await self._stop(snapshot, run_id)
                case Follow():
                    with self._follow_span.within(action.attempt, action.hermes_run_id):
                        snapshot = await self._follow(snapshot, action)

    async def _waits(self, view: JobView) -> Ending | None:
        """How the job waits without asking Hermes: held by its key's quota (SPEC S4.4: no hold that RUNS_HOLD
        expires; woken, it waits on), or for its session (S4.3); None: it is driven."""
        if not self.has_slot and await self._deps.gate.held(view):
            self.view = view
            return Ending.HELD
        return None if await self._holds_session(view) else Ending.PARKED_FOR_SESSION

    async def _holds_session(self, view: JobView) -> bool:
        """A turn of an ordered session asks Hermes only while it holds its session (SPEC S4.3); one that does not
        is parked, out of the line, and its slot (if granted one) goes back."""
        conversations = self._deps.conversations
        if conversations is None or not waits(view):
            return True
        now = self._deps.clock.now_ms()
        turn = await conversations.check(view, now, self._place or line_place(view))
        if turn.holds:
            self._turn_since = max(self._turn_since, turn.since_ms)
            return True
        self.view = view
        self.recheck_at = recheck_at(turn, now)
        self._log.debug("A turn waits for its session.", extra={"job": self.job_id, "holder": turn.holder})
        return False

    async def _submit(self, snapshot: Snapshot, action: Submit) -> Snapshot:
        if self._moved is not None and self.slot_upstream is not None:
            snapshot = await self._rerouted(snapshot, self.slot_upstream, *self._moved)
            self._moved = None
        view, deps = snapshot.view, self._deps
        created = await self._created()
        body = created.body.encode()
        if created.session_history and deps.conversations is not None:  # SPEC S4.3: the session's earlier turns
            body = await deps.conversations.with_history(view, created)
        since = decide.waiting_since(view, self._turn_since)
        hold = view.hold.reason.value if view.hold is not None else None
        tracing.start(
            tracing.ADMISSION, start_ms=since, attributes={tracing.ATTEMPT: action.attempt, "job.hold": hold}
        ).end()
        with tracing.within(None, {tracing.ATTEMPT: action.attempt}):
            create = asyncio.ensure_future(
                deps.client(self.slot_upstream).create(
                    body, idempotency_key=action.idempotency_key, session_key=view.session_key
                )
            )
        try:
            outcome = await asyncio.shield(create)
        except asyncio.CancelledError:  # the lease lost (or a drain) while Hermes creates the run
            self.unrecorded = forsaken.Unrecorded(create, action.attempt, self.slot_upstream)
            forsaken.when_answered(deps, self.job_id, self.unrecorded)
            raise
        now = deps.clock.now_ms()
        refused = decide.refusal_of(outcome)
        retry_at = now
        if refused is not None:  # back to its place in the line first, so no replica waits on a lost slot
            if not await deps.leases.renew(self.job_id, self.token, now):
                raise LeaseLost(self.job_id)  # taken over meanwhile: its slot and place are the new owner's
            place = line_place(view)
            retry_at = (
                await deps.gate.refused(
                    self.job_id, refused, now, jitter=deps.jitter(), place=place, upstream=self.slot_upstream
                )
            ).retry_at_ms
            self.has_slot = False
        try:
            snapshot = await self._record_answer(snapshot, action.attempt, outcome, now, retry_at)
        except BaseException:
            # taken over, a drain, or Redis out of reach before the run was recorded: the job's next create makes a
            # second run, unless Hermes replayed it with this one (or the record landed after all): forsaken.py
            # tells which
            if isinstance(outcome, Accepted):
                self.unrecorded = forsaken.Unrecorded(create, action.attempt, self.slot_upstream)
                forsaken.forsake(deps, self.job_id, self.unrecorded.attempt, self.unrecorded.upstream, outcome.run_id)
            raise
        if isinstance(outcome, Accepted):
            if not await self._ran(snapshot.view, action.attempt, outcome.run_id, now):
                # The job ended (a stop) while Hermes was creating the run: stop the orphan.
                await forsaken.stop(deps, self.slot_upstream, outcome.run_id)
            else:
                if self._pump is not None:  # an earlier attempt's stream: closed, not left open beside the new one
                    await self._pump.close()
                with self._follow_span.within(action.attempt, outcome.run_id):  # the stream: a child of the follow
                    self._pump = Pump(deps.client(self.slot_upstream), action.attempt, outcome.run_id)
                self._log.info("Following a Hermes run.", extra={"job": self.job_id, "hermesRun": outcome.run_id})
        return snapshot

    async def _record_answer(
        self, snapshot: Snapshot, attempt: int, outcome: CreateOutcome, now: int, retry_at: int
    ) -> Snapshot:
        """Record Hermes's answer to the create of `attempt`. A run it accepted is recorded through a Redis outage:
        the write goes again (with backoff) until Redis takes it, since a job handed back instead would be created
        again, a second run of the attempt beside this one (SPEC S4). It stops when another replica took the job; a
        lease that ran out meanwhile with nobody taking it is taken back. A write that landed though its reply was
        lost is found by the next one (a conflict: the run is recorded)."""
        deps, failures = self._deps, 0
        upstream = self.slot_upstream or deps.upstream

        def facts(view: JobView) -> list[JobEvent]:
            return decide.on_create(
                view,
                attempt,
                outcome,
                now,
                retry_at_ms=retry_at,
                policy=deps.policy,
                upstream=upstream,
                turn_since_ms=self._turn_since,
            )

        with deps.leases.writing(self.job_id, self.token):  # a renewal that finds the lease gone leaves it to this
            while True:
                try:
                    return await self._commit(snapshot, facts)
                except Exception as error:
                    lapsed = isinstance(error, LeaseLost) and failures > 0  # it ran out during the outage
                    if not isinstance(outcome, Accepted) or not (lapsed or is_outage(error)):
                        raise
                    failures += 1
                    if failures == 1:
                        fields = {"job": self.job_id, "hermesRun": outcome.run_id, "error": outage_name(error)}
                        self._log.warning("Lost Redis recording a run Hermes accepted; retrying.", extra=fields)
                    if await self._taken():
                        raise LeaseLost(self.job_id) from error
                await asyncio.sleep(decide.backoff_ms(failures, deps.jitter(), deps.policy) / 1000)

    async def _taken(self) -> bool:
        """Does another replica hold the job's lease? Read first, so a Redis that takes no writes (read-only after a
        failover, full) still tells a takeover; one that ran out with nobody taking it is taken back. False when
        Redis does not answer."""
        leases = self._deps.leases
        try:
            holder = await leases.holder(self.job_id)
            if holder is None:
                return not await leases.acquire(self.job_id, self.token, self._deps.clock.now_ms())
            return holder != self.token
        except Exception as error:
            if not is_outage(error):
                raise
            return False

    async def _ran(self, view: JobView, attempt: int, run_id: str, now: int) -> bool:
        """Hermes accepted `run_id` for `attempt` under this runner's slot: its capacity is taken; is it the job's?"""
        self.ran = True
        await self._deps.gate.accepted(self.job_id, now, upstream=self.slot_upstream)
        await self._remember_session(view)
        return view.accepted_attempt == attempt and view.hermes_run_id == run_id

    async def record_unrecorded(self, timeout_s: float) -> bool:
        """A drain cancelled this runner while Hermes created the job's run (or while its answer was recorded): wait
        for the answer and record an accepted run under the lease the drain still holds, so the job's next owner
        follows that run instead of creating a second one (Hermes 0.19 ignores the create's key). True: recorded."""
        unrecorded, self.unrecorded = self.unrecorded, None
        deadline = asyncio.get_running_loop().time() + timeout_s
        if unrecorded is None or not await forsaken.answered(
            self._deps, self.job_id, self.token, unrecorded, timeout_s, slot=self.has_slot
        ):
            return False
        outcome, now = unrecorded.create.result(), self._deps.clock.now_ms()
        if not isinstance(outcome, Accepted):
            await self._refused_while_draining(outcome, now, unrecorded.upstream)
            return False
        policy, attempt = self._deps.policy, unrecorded.attempt
        upstream = unrecorded.upstream or self._deps.upstream
        try:
            snapshot = await self._commit(
                await self._reload(),
                lambda v: decide.on_create(v, attempt, outcome, now, retry_at_ms=now, policy=policy, upstream=upstream),
            )
        except LeaseLost:
            return False  # taken over meanwhile: forsaken.py watches the run
        self.view = snapshot.view
        if await self._ran(snapshot.view, attempt, outcome.run_id, now):
            return True
        # The job ended (a stop) while Hermes was creating the run: stop the orphan now, as the process exits next
        # (within the drain's budget: else it is left to the prober)
        left = max(0.0, deadline - asyncio.get_running_loop().time())
        await forsaken.stop(self._deps, unrecorded.upstream, outcome.run_id, timeout_s=left)
        return False

    async def _refused_while_draining(self, outcome: CreateOutcome, now: int, upstream: str | None) -> None:
        """Hermes refused the create a drain waited for (busy, draining): the line learns it, as from any refusal
        (SPEC S4.1), and the job goes back to its place with its slot (the drain holds its lease)."""
        refused = decide.refusal_of(outcome)
        if refused is None or not self.has_slot or self.view is None:
            return
        place = line_place(self.view)
        await self._deps.gate.refused(
            self.job_id, refused, now, jitter=self._deps.jitter(), place=place, upstream=upstream
        )
        self.has_slot = False

    async def _created(self) -> JobCreated:
        if self._job is None:
            self._job = await self._deps.writer.store.created_event(self.job_id, self._created_json)
        return self._job

    async def _append_decided(self, snapshot: Snapshot, events: list[JobEvent]) -> Snapshot:
        """Append what next_action decided; after a concurrent append, decide again instead."""
        return await self._commit(snapshot, lambda v: events if v is snapshot.view else [], retry=False)

    async def _rerouted(self, snapshot: Snapshot, to: str, moved_from: str, reason: str) -> Snapshot:
        """Record that the job's session moved to `to` (SPEC S10 `job.rerouted`), before its create there."""
        now = self._deps.clock.now_ms()
        return await self._commit(
            snapshot,
            lambda v: (
                []
                if v.status.terminal
                else [JobRerouted(job_id=v.job_id, at_ms=now, from_upstream=moved_from, to_upstream=to, reason=reason)]
            ),
        )

    async def _remember_session(self, view: JobView) -> None:
        """The session's next jobs go where this one's run was accepted (SPEC S10), for RUNS_RETENTION from now."""
        affinity = self._deps.affinity
        if affinity is not None and view.session_id and view.attempts:
            await affinity.remember(view.session_id, view.upstream or self._deps.upstream or "")

    async def _announce(self, view: JobView) -> None:
        if view.accepted_attempt == view.attempt and view.hermes_run_id and not view.status.terminal:
            self._deps.metrics.takeovers.inc()
            fields = {"job": self.job_id, "attempt": view.attempt, "hermesRun": view.hermes_run_id}
            self._log.info("Took over a job.", extra=fields)
            attributes: tracing.Attributes = {tracing.ATTEMPT: view.attempt, tracing.RUN: view.hermes_run_id}
            tracing.start(tracing.TAKEOVER, attributes=attributes).end()
            if not self.has_slot:  # its run is live on Hermes: it counts against its upstream's limit again
                self.slot_upstream = view.upstream
                now, key = self._deps.clock.now_ms(), view.scheduling.fairness_key
                await self._deps.gate.hold([self.job_id], now, upstream=self.slot_upstream, fairness_key=key)
                self.has_slot = self.ran = True
