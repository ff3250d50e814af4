"""One asyncio task per driven job: it executes decide()'s actions and appends what Hermes answered.

Every append is fenced by the run lease and by the stream position it decided on; on a conflict
(a stop recorded meanwhile) it re-reads the job and decides again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from broker import tracing
from broker.admission.state import line_place
from broker.driver import decide, forsaken
from broker.driver.decide import Append, Done, Follow, Queue, StopRun, Submit
from broker.driver.deps import Deps, Ending
from broker.driver.follow_span import FollowSpan
from broker.driver.pump import Nudge, Pump, release
from broker.errors import LeaseLost
from broker.events import JobCreated, JobEvent, JobRerouted
from broker.hermes.client import HermesClient
from broker.hermes.models import Accepted, CreateOutcome, HermesEvent, HermesRun, NotFound
from broker.jobs.conversation import ANSWER_RECHECK_MS, recheck_at, waits
from broker.logging import get_logger
from broker.store.jobs import Snapshot
from projections.job import JobView

MAX_CONFLICTS = 50


class Runner:
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
        self.job_id = job_id
        self._place = place  #: where the job was in the line when granted (None: not granted from it)
        #: when its turn of its session began (SPEC S4.3), or its wait for its key's quota ended (S4.4): its wait for
        #: Hermes (RUNS_HOLD) counts from then
        self._turn_since = waited_until
        self.recheck_at: int | None = None  #: set when it ends PARKED_FOR_SESSION: when it looks again
        self.token = token
        self.has_slot = admitted  #: this runner holds the job's admission slot
        #: the upstream whose admission slot it holds (SPEC S10): granted, or its live run's on a takeover
        self.slot_upstream = upstream
        self._moved = moved  #: (from, reason): its session moved to `upstream` (SPEC S10), recorded before the create
        self.ran = False  #: a run of the job was live on Hermes under this slot (its release frees capacity)
        self.queued: Queue | None = None  #: set when the run ends QUEUED
        #: a create whose answer this runner stopped waiting for (or recording) when it was cancelled
        self.unrecorded: forsaken.Unrecorded | None = None
        self.view: JobView | None = None  #: the job as last seen
        self._deps = deps
        self._stored = stored  #: the job's view hash as read with the grant (None: read it first)
        self._created_json = created  #: its JobCreated JSON as read with the grant (None: read it when submitting)
        self._job: JobCreated | None = None  #: the job's JobCreated (its body, its trace context), once read
        self._follow_span = FollowSpan(lambda: self.view.status.value if self.view is not None else None)
        self._wake = Nudge()
        self._pump: Pump | None = None
        self._stop_sent_attempt = 0
        self._failures = 0  #: consecutive calls Hermes did not answer (stop, poll): the backoff exponent
        self._suspect_terminal = False
        self._log = get_logger(type(self))

    def nudge(self) -> None:
        """The job's stream changed outside this runner (a stop, an approval): look now."""
        self._wake.set()

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
        now, policy = deps.clock.now_ms(), deps.policy
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
            snapshot = await self._commit(
                snapshot,
                lambda v: decide.on_create(
                    v,
                    action.attempt,
                    outcome,
                    now,
                    retry_at_ms=retry_at,
                    policy=policy,
                    upstream=self.slot_upstream or deps.upstream,
                    turn_since_ms=self._turn_since,
                ),
            )
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

    async def _stop(self, snapshot: Snapshot, run_id: str) -> Snapshot:
        outcome = await self._run_client(snapshot.view).stop(run_id)
        now = self._deps.clock.now_ms()
        answer = decide.on_stop(snapshot.view, outcome, now)
        if answer.retry:
            if await self._deps.gate.store.lost(snapshot.view.upstream, now):
                # its upstream is lost: the run counts as interrupted, and the stop wins (SPEC S10, S3.4)
                return await self._upstream_lost(snapshot, Follow(snapshot.view.attempt, run_id))
            message = "Could not reach Hermes to stop a run; retrying with backoff."
            await self._back_off(message, run_id, outcome, self._run_client(snapshot.view))
            return await self._reload()
        self._failures = 0
        if answer.sent:
            self._stop_sent_attempt = snapshot.view.attempt
            self._log.info("Asked Hermes to stop a run.", extra={"job": self.job_id, "hermesRun": run_id})
        return await self._commit(snapshot, lambda v: list(decide.on_stop(v, outcome, now).events))

    async def _back_off(self, message: str, run_id: str, outcome: object, client: HermesClient) -> None:
        """Wait before asking Hermes again: jittered exponential backoff, one warn line per failure streak; cut short
        when a call to the same server gets an answer (it is back: a restarted Hermes is polled at once)."""
        self._failures += 1
        if self._failures == 1:
            fields = {"job": self.job_id, "hermesRun": run_id, "error": getattr(outcome, "reason", repr(outcome))}
            self._log.warning(message, extra=fields)
        await self._sleep(decide.backoff_ms(self._failures, self._deps.jitter(), self._deps.policy), client.answered())

    async def _follow(self, snapshot: Snapshot, action: Follow) -> Snapshot:
        pump = self._pump
        if pump is None or pump.ended or pump.attempt != action.attempt:
            return await self._poll(snapshot, action)
        try:
            items = await pump.wait(self._deps.poll_interval_ms / 1000, self._wake)
        except asyncio.CancelledError:  # a drain, maybe while events waited for more: they are stored first
            with contextlib.suppress(Exception):
                await self._relay(snapshot, action, pump.take())
            raise
        if self._wake.is_set():
            self._wake.clear()
            snapshot = await self._reload()
        events = pump.events(items)
        if events:
            self._suspect_terminal = False
            snapshot = await self._relay(snapshot, action, events)
        elif not items:
            snapshot = await self._check_silence(snapshot, action)
        return snapshot

    async def _relay(self, snapshot: Snapshot, action: Follow, events: list[HermesEvent]) -> Snapshot:
        if not events:
            return snapshot
        now, policy = self._deps.clock.now_ms(), self._deps.policy
        return await self._commit(
            snapshot, lambda v: decide.on_events(v, action.attempt, action.hermes_run_id, events, now, policy)
        )

    async def _check_silence(self, snapshot: Snapshot, action: Follow) -> Snapshot:
        """No event for a poll interval: make sure the run is still there, and not finished behind a hung stream."""
        snapshot = await self._reload()  # a stop whose nudge was lost is seen here
        if snapshot.view.stop_requested and self._stop_sent_attempt != snapshot.view.attempt:
            return snapshot
        run = await self._run_client(snapshot.view).get(action.hermes_run_id)
        if isinstance(run, HermesRun) and run.terminal and not self._suspect_terminal:
            self._suspect_terminal = True  # give the stream one more interval to deliver the terminal event
            return snapshot
        if isinstance(run, HermesRun | NotFound):
            return await self._settle(snapshot, action, run)
        if await self._deps.gate.store.lost(snapshot.view.upstream, self._deps.clock.now_ms()):
            return await self._upstream_lost(snapshot, action)  # a frozen host: its stream is silent, polls fail
        return snapshot

    async def _poll(self, snapshot: Snapshot, action: Follow) -> Snapshot:
        run = await self._run_client(snapshot.view).get(action.hermes_run_id)
        if isinstance(run, HermesRun | NotFound):
            self._failures = 0
            snapshot = await self._settle(snapshot, action, run)
            if not snapshot.view.status.terminal and snapshot.view.attempt == action.attempt:
                await self._sleep(self._deps.poll_interval_ms)
        elif await self._deps.gate.store.lost(snapshot.view.upstream, self._deps.clock.now_ms()):
            snapshot = await self._upstream_lost(snapshot, action)  # SPEC S10: resubmitted elsewhere
        else:  # Hermes is unreachable: poll again, backing off past the poll interval
            message = "Could not reach Hermes to poll a run; retrying with backoff."
            await self._back_off(message, action.hermes_run_id, run, self._run_client(snapshot.view))
        return await self._reload() if not snapshot.view.status.terminal else snapshot

    async def _settle(self, snapshot: Snapshot, action: Follow, run: HermesRun | NotFound) -> Snapshot:
        now, policy = self._deps.clock.now_ms(), self._deps.policy
        return await self._commit(snapshot, lambda v: decide.on_status(v, action.attempt, run, now, policy))

    async def _commit(
        self, snapshot: Snapshot, facts: Callable[[JobView], list[JobEvent]], *, retry: bool = True
    ) -> Snapshot:
        """Append what `facts` derives from the job (fenced by the lease), re-deriving it after a conflict."""
        with self._deps.leases.writing(self.job_id, self.token):  # a renewal meanwhile may find its lease released
            after = await self._deps.writer.commit(
                self.job_id,
                snapshot,
                facts,
                log=self._log,
                lease_token=self.token,
                retry=retry,
                released=self._released,
            )
        if after.view.attempt > snapshot.view.attempt:  # RunResubmitted
            attributes: tracing.Attributes = {
                tracing.ATTEMPT: after.view.attempt,
                tracing.RUN: snapshot.view.hermes_run_id,
            }
            tracing.start(tracing.RESUBMIT, attributes=attributes).end()
        return after

    def _released(self) -> None:
        """The write that ended the job released its run lease too: the supervisor's release costs nothing."""
        self._deps.leases.released(self.job_id, self.token)

    async def _created(self) -> JobCreated:
        if self._job is None:
            self._job = await self._deps.writer.store.created_event(self.job_id, self._created_json)
        return self._job

    async def _append_decided(self, snapshot: Snapshot, events: list[JobEvent]) -> Snapshot:
        """Append what next_action decided; after a concurrent append, decide again instead."""
        return await self._commit(snapshot, lambda v: events if v is snapshot.view else [], retry=False)

    async def _reload(self) -> Snapshot:
        return await self._deps.writer.load(self.job_id)

    async def _upstream_lost(self, snapshot: Snapshot, action: Follow) -> Snapshot:
        """Its upstream has answered nothing for HERMES_UPSTREAM_LOST: the run counts as interrupted, and the
        resubmit goes back to the line without the lost upstream's slot, so it is routed elsewhere (SPEC S10)."""
        now, policy = self._deps.clock.now_ms(), self._deps.policy
        # its run may still be live there: stopped once the upstream answers again (SPEC S10). Recorded first, so a
        # crash before the resubmit below cannot forget it (a stop of a run still followed is an interruption)
        await self._deps.gate.store.health.orphan(snapshot.view.upstream, action.hermes_run_id, now)
        snapshot = await self._commit(snapshot, lambda v: decide.on_upstream_lost(v, action.attempt, now, policy))
        if snapshot.view.attempt > action.attempt or snapshot.view.status.terminal:
            if self._pump is not None:
                await self._pump.close()
                self._pump = None
        if self.has_slot:
            await self._deps.gate.release(self.job_id, freed=False, upstream=self.slot_upstream)
            self.has_slot = False
        return snapshot

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

    def _run_client(self, view: JobView) -> HermesClient:
        """The client of the upstream of the job's accepted run (SPEC S10: its attempt belongs to it)."""
        return self._deps.client(view.upstream)

    async def _sleep(self, ms: int | float, or_when: Coroutine[Any, Any, None] | None = None) -> None:
        """Sleep, or less when nudged (or when `or_when` happens first)."""
        if or_when is None:
            if await self._wake.sleep(max(ms, 0) / 1000):
                self._wake.clear()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        happened = asyncio.ensure_future(or_when)
        happened.add_done_callback(lambda _: release(waiter))
        try:
            await self._wake.wait(waiter, max(ms, 0) / 1000)
        finally:
            happened.cancel()
        self._wake.clear()

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
