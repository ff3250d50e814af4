"""JobService: create, replay and read jobs. read -> fold -> decide -> append; IO only here."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import orjson
from attrs import evolve, frozen
from redis.asyncio import Redis

from broker import tracing
from broker.admission.fair import FairnessSettings, resolve
from broker.admission.quotas import Quotas, bound_of
from broker.admission.state import shown_hold
from broker.clock import Clock
from broker.errors import (
    Conflict,
    IdempotencyConflict,
    InvalidRequest,
    JobNotFound,
    QueueFull,
    RedisNearlyFull,
    SessionBusy,
    Unavailable,
)
from broker.events import ApprovalDenied, JobCreated, JobEvent
from broker.hermes.client import HermesClient
from broker.hermes.fleet import ClientOf
from broker.hermes.models import Relayed
from broker.ids import job_id_for_key, new_job_id
from broker.jobs import rules
from broker.jobs.commands import ApprovalChoice, CreateRun
from broker.jobs.conversation import Conversations, SessionTurns, ordered, session_hold
from broker.jobs.memory_watch import MemoryWatch
from broker.jobs.writer import Writer
from broker.logging import get_logger
from broker.metrics import Metrics
from broker.store import leases, quota_view, signals
from broker.store.admission import AdmissionStore
from broker.store.jobs import Snapshot
from broker.store.outage import is_outage
from broker.store.scripts import ring_work
from projections.job import Hold, JobView


@frozen
class CreateResult:
    view: JobView
    replayed: bool


class JobService:
    """The job use cases the HTTP handlers call; handlers never touch Redis."""

    def __init__(
        self,
        writer: Writer,
        clock: Clock,
        metrics: Metrics,
        *,
        redis: Redis,
        hermes: HermesClient,
        admission: AdmissionStore | None = None,
        fairness: FairnessSettings | None = None,
        client_of: ClientOf | None = None,
        memory: MemoryWatch | None = None,
        conversations: Conversations | None = None,
        session_history: bool = False,
        quotas: Quotas | None = None,
        max_waiting: int = 0,
    ) -> None:
        self._writer = writer
        self._quotas = quotas or Quotas()  #: ADMISSION_QUOTAS: a key's `waiting` bounds its creates (SPEC S4.4)
        self._max_waiting = max_waiting  #: ADMISSION_MAX_WAITING
        self._conversations = conversations  #: sessions' turns in order (SPEC S4.3); None: every turn in parallel
        self._session_history = session_history  #: RUNS_SESSION_HISTORY
        self._memory = memory
        self._fairness = fairness or FairnessSettings()
        self._admission = admission
        self._clock = clock
        self._metrics = metrics
        self._redis = redis
        self._hermes = hermes
        self._client_of: ClientOf = client_of or (lambda _: hermes)  #: an attempt's upstream's (SPEC S10)
        self._log = get_logger(type(self))

    async def create(self, request: CreateRun, *, traceparent: str | None = None) -> CreateResult:
        """Store a new job, or answer the one its Idempotency-Key already claimed.

        `traceparent`: the create's span, stored with a new job so its whole life is one trace (SPEC S6.1)."""
        key = request.idempotency_key
        if self._memory is not None and not self._memory.admit(len(request.body)):
            return await self._replay_only(request)
        scheduling = resolve(
            request.scheduling,
            session_key=request.session_key,
            session_id=request.session_id,
            settings=self._fairness,
        )
        job_id, now = job_id_for_key(key) if key else new_job_id(), self._clock.now_ms()
        took = False  #: a `reject` turn took its session before its job is stored
        if self._conversations is None:
            scheduling = evolve(scheduling, multitask="parallel")
        elif scheduling.multitask == "reject" and request.session_id is not None:
            took = await self._take_unless_held(request, request.session_id, job_id, now)
        event = JobCreated(
            job_id=job_id,
            at_ms=now,
            body=request.body.decode(),
            fingerprint=request.fingerprint,
            idempotency_key=key,
            session_key=request.session_key,
            session_id=request.session_id,
            model=request.model,
            context=request.context,
            reporting=request.reporting,
            traceparent=traceparent,
            scheduling=scheduling,
            session_history=self._history(request, scheduling.multitask),
            callback_url=request.callback_url,
        )
        try:
            bound = bound_of(self._quotas, self._max_waiting, scheduling.fairness_key)
            quota = self._admission.quota if self._admission is not None else None
            held = await quota_view.held(quota, bound, scheduling.fairness_key) if quota is not None else (0, 0)
            outcome = await self._writer.create(event, bound, held)
        except QueueFull as full:
            if took and self._conversations is not None and request.session_id is not None:
                await self._conversations.withdraw(request.session_id, job_id, now)  # no job: the session is free
            return await self._replay_only(request, refused=full)
        except Exception as error:
            if is_outage(error):  # answered 503 by the error middleware (a full Redis too: OOM)
                self._metrics.creates_not_taken.labels("outage").inc()
            raise
        view = outcome.snapshot.view
        if self._conversations is not None and ordered(view):  # a replay too: its create may have died before this
            await self._conversations.join(view, event.at_ms)
            if view.scheduling.multitask == "interrupt":  # a replay too (stopping a stopped turn changes nothing)
                await self._interrupt(view)
        if outcome.created:
            self._metrics.jobs_created.inc()
            self._log.info("Created a job.", extra={"job": event.job_id, "idempotent": key is not None})
            return CreateResult(outcome.snapshot.view, replayed=False)
        return self._replayed(outcome.snapshot.view, request)

    def _history(self, request: CreateRun, multitask: str) -> bool:
        """Whether the job's runs get its session's earlier turns (SPEC S4.3): as the create asked (its conflicts
        answered 400 already), else RUNS_SESSION_HISTORY where it can apply."""
        if request.session_history is not None:
            if request.session_history and multitask != "enqueue":
                raise InvalidRequest(
                    "invalid_field", "session_history needs scheduling.multitask enqueue", param="session_history"
                )
            return request.session_history
        if not self._session_history or multitask != "enqueue" or request.session_id is None:
            return False
        body = orjson.loads(request.body)
        return "conversation_history" not in body and "previous_response_id" not in body

    async def _take_unless_held(self, request: CreateRun, session_id: str, job_id: str, now_ms: int) -> bool:
        """multitask `reject` (SPEC S4.3): 409 while an earlier turn of the session is queued or live, nothing
        stored; else the turn takes the session before its job is stored. A replay of an accepted Idempotency-Key is
        still answered with its job."""
        assert self._conversations is not None
        if request.idempotency_key is not None and await self._writer.store.load(job_id) is not None:
            return False
        holder = await self._conversations.take_unless_held(session_id, job_id, now_ms)
        if holder is not None:
            self._metrics.creates_not_taken.labels("session_busy").inc()
            raise SessionBusy(session_id, holder)
        return True

    async def _interrupt(self, view: JobView) -> None:
        """multitask `interrupt` (SPEC S4.3): the session's earlier turns are stopped, ending `superseded`; the new
        turn runs once they settled (it holds the session after them)."""
        assert self._conversations is not None
        now, later = self._clock.now_ms(), view.job_id

        def superseded(earlier: JobView) -> list[JobEvent]:
            return rules.on_stop_request(earlier, now, superseded_by=later)

        for earlier in await self._conversations.ahead_of(view):
            try:
                await self._stopped(earlier, superseded)
            except JobNotFound:  # expired: released by the next check
                continue

    async def _replay_only(self, request: CreateRun, *, refused: QueueFull | None = None) -> CreateResult:
        """Redis is nearly full, or the line (SPEC S4.4): no new job, but the job an Idempotency-Key already claimed
        is still answered (a replay stores nothing; one read, and only for a refused create)."""
        key = request.idempotency_key
        if key is not None:
            try:
                return self._replayed((await self._load(job_id_for_key(key))).view, request)
            except JobNotFound:
                pass
        self._metrics.creates_not_taken.labels("redis_memory" if refused is None else "queue_full").inc()
        raise refused or RedisNearlyFull()

    def _replayed(self, existing: JobView, request: CreateRun) -> CreateResult:
        if existing.fingerprint != request.fingerprint or existing.idempotency_key != request.idempotency_key:
            self._log.warning("Rejected a conflicting idempotent create.", extra={"job": existing.job_id})
            raise IdempotencyConflict()
        self._metrics.jobs_replayed.inc()
        self._log.info("Replayed a job.", extra={"job": existing.job_id, "status": existing.status.value})
        return CreateResult(existing, replayed=True)

    async def owners(self, views: Sequence[JobView]) -> list[str | None]:
        """The replica driving each job (SPEC S3.2 `owner`): its run lease's; a finished job has none (no read)."""
        live = [view.job_id for view in views if not view.status.terminal]
        found = dict(zip(live, await leases.owners(self._redis, live), strict=True))
        return [found.get(view.job_id) for view in views]

    async def get(self, job_id: str) -> JobView:
        """The job as callers see it: a waiting job shows the admission line's hold (SPEC S3.2, S4.1)."""
        view = (await self._load(job_id)).view
        return await self.with_line_hold(view)

    async def with_line_hold(self, view: JobView) -> JobView:
        return (await self.with_line_holds([view]))[0]

    async def with_line_holds(self, views: Sequence[JobView]) -> list[JobView]:
        """The views as callers see them: waiting jobs with the line's hold (one read of the line for all)."""
        if self._admission is None or not any(map(_waiting, views)):
            return list(views)
        now = self._clock.now_ms()
        waiting = [view for view in views if _waiting(view)]
        holders = await self._conversations.holders(waiting) if self._conversations is not None else {}
        held: dict[str, Hold | None] = {
            view.job_id: session_hold(view, holder, now)
            for view in waiting
            if ordered(view) and (holder := holders.get(view.session_id or "")) is not None and holder != view.job_id
        }
        waiting = [view for view in waiting if view.job_id not in held]
        quota = self._admission.quota
        if waiting and quota is not None and quota.enforced:  # held by their keys' quotas (SPEC S4.4)
            held.update(await quota_view.holds(quota, waiting, now))
            waiting = [view for view in waiting if view.job_id not in held]
        if waiting:
            line = await self._admission.state(now, lines=False)
            needs = await self._admission.needs(waiting)
            held.update(
                (view.job_id, shown_hold(view, line, now, need)) for view, need in zip(waiting, needs, strict=True)
            )
        return [evolve(view, hold=held[view.job_id]) if view.job_id in held else view for view in views]

    async def session_turns(self, view: JobView, *, most: int, recent: int) -> SessionTurns | None:
        """The turns of the job's session (SPEC S4.3) as the console shows them, waiting ones with their hold;
        None for a job without a `session_id`."""
        if self._conversations is None or view.session_id is None:
            return None
        turns = await self._conversations.turns(view.session_id, most=most, recent=recent)
        shown = iter(await self.with_line_holds([turn for _, turn in turns.unfinished if turn is not None]))
        unfinished = tuple((job_id, None if turn is None else next(shown)) for job_id, turn in turns.unfinished)
        return evolve(turns, unfinished=unfinished)

    async def stop(self, job_id: str, *, caller: str | None = None) -> JobView:
        """Record the stop first; a job with no live Hermes run is cancelled at once, others by their owner.

        `caller`: the request's traceparent, linked from the stop's span in the job's trace."""
        now = self._clock.now_ms()
        span = await self._span(tracing.STOP, job_id, caller)
        with span, span.current():
            view = await self._stopped(job_id, lambda view: rules.on_stop_request(view, now))
            span.set(tracing.STATUS, view.status.value)
            return view

    async def _stopped(self, job_id: str, facts: Callable[[JobView], list[JobEvent]]) -> JobView:
        """Record a stop; a waiting turn that ended with it hands its session on (SPEC S4.3), and a job held by its
        key's quota leaves its held jobs (S4.4: it waits no more)."""
        view = await self._record(job_id, facts)
        quota = self._admission.quota if self._admission is not None else None
        if quota is not None and quota.enforced and view.status.terminal:
            await quota.forget([(job_id, view.scheduling.fairness_key)])
        if self._conversations is not None and view.status.terminal:
            await self._conversations.ended(view, self._clock.now_ms(), look_up=False)
            if view.unanswered_on is not None and ordered(view):  # its create's run may be live: a runner looks it up
                await ring_work(self._redis, {"job": job_id})
        return view

    async def approve(
        self, job_id: str, choice: ApprovalChoice, *, caller: str | None = None
    ) -> tuple[int, dict[str, object]]:
        """Forward an approval to the job's live Hermes run; a deny is a denied stop (SPEC S3.5)."""
        span = await self._span(tracing.APPROVAL, job_id, caller)
        with span, span.current():
            span.set("approval.choice", choice.choice)
            return await self._approve(job_id, choice)

    async def _approve(self, job_id: str, choice: ApprovalChoice) -> tuple[int, dict[str, object]]:
        view = await self.get(job_id)
        live = view.accepted_attempt == view.attempt and view.hermes_run_id and not view.status.terminal
        if not live or view.hermes_run_id is None:
            raise Conflict("approval_not_active", f"Run has no live Hermes run: {job_id}")
        outcome = await self._client_of(view.upstream).approval(view.hermes_run_id, orjson.dumps(choice.body()))
        if not isinstance(outcome, Relayed):
            raise Unavailable("Hermes did not answer the approval")
        if outcome.status == 404:
            raise Conflict("approval_not_active", f"Run has no live Hermes run: {job_id}")
        payload = dict(outcome.payload)
        if "run_id" in payload:
            payload["run_id"] = job_id
        if outcome.status == 200 and choice.choice == "deny":
            now, attempt = self._clock.now_ms(), view.attempt

            def denied(current: JobView) -> list[JobEvent]:
                if current.status.terminal or current.attempt != attempt or current.denied_command is not None:
                    return []
                command = current.approval_command or ""
                return [ApprovalDenied(job_id=job_id, at_ms=now, attempt=attempt, command=command)]

            await self._record(job_id, denied)
        return outcome.status, payload

    async def _record(self, job_id: str, facts: Callable[[JobView], list[JobEvent]]) -> JobView:
        """read -> decide -> append (again after a concurrent append); then nudge the job's owner."""
        before = await self._load(job_id)
        after = await self._writer.commit(job_id, before, facts, log=self._log)
        if after.last_id != before.last_id:
            await signals.nudge(self._redis, job_id)
        return after.view

    async def _span(self, name: str, job_id: str, caller: str | None) -> tracing.Span:
        """A request's span in the job's trace: its stored context is read (one XRANGE) only when tracing."""
        if not tracing.enabled():
            return tracing.NO_SPAN
        parent = await self._writer.store.traceparent(job_id)
        links = [caller] if caller else []
        return tracing.start(
            name, parent=parent, kind=tracing.Kind.SERVER, attributes={tracing.JOB: job_id}, links=links
        )

    async def _load(self, job_id: str) -> Snapshot:
        return await self._writer.load(job_id)


def _waiting(view: JobView) -> bool:
    """Not terminal and without an accepted run: the job is in (or about to enter) the admission line."""
    return not view.status.terminal and view.accepted_attempt != view.attempt
