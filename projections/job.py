"""The job view of SPEC S3.2 as a pure fold over a job's events. No IO, no clock."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import assert_never

from attrs import evolve, field, frozen

from broker.events import (
    ApprovalDenied,
    Context,
    DeltasDropped,
    HermesEventRecorded,
    HoldReason,
    JobCreated,
    JobEvent,
    JobFinished,
    JobHeld,
    JobRerouted,
    JobStatus,
    Reporting,
    RunAccepted,
    RunInterrupted,
    RunResubmitted,
    Scheduling,
    StopRequested,
    UnknownEvent,
)

_ACTIVE = (JobStatus.RUNNING, JobStatus.WAITING_FOR_APPROVAL)


@frozen
class Hold:
    reason: HoldReason
    since_ms: int
    retry_at_ms: int
    detail: str | None = None  #: Hermes's words for the last refusal, or a sentence of the broker's


@frozen(kw_only=True)
class JobView:
    """Everything the broker answers about a job and needs to drive it."""

    job_id: str
    status: JobStatus
    created_at_ms: int
    updated_at_ms: int
    fingerprint: str  #: the execution body itself stays in the job's JobCreated (JobStore.execution_body)
    idempotency_key: str | None = None
    session_key: str | None = None
    session_id: str | None = None
    model: str | None = None
    context: Context | None = None
    reporting: Reporting = field(factory=Reporting)
    scheduling: Scheduling = field(factory=Scheduling)  #: its place in the line (SPEC S4.2)
    last_event: str | None = "job.queued"
    attempt: int = 1  #: the attempt being driven (accepted or not yet)
    attempts: int = 0  #: runs Hermes accepted
    accepted_attempt: int = 0  #: the last attempt Hermes accepted (== attempt: the current run is live)
    #: when Hermes accepted the run that holds a slot now (its Hermes time runs from here, SPEC S4.5); None: no run
    #: holds one (not accepted yet, interrupted, ended), or the view was stored before it was kept
    live_since_ms: int | None = None
    hold_count: int = 0  #: consecutive holds of the current attempt (the backoff exponent)
    approval_command: str | None = None  #: command of the last approval.request of the current run
    event_count: int = 0  #: events stored in the job's stream (RUNS_EVENTS_MAXLEN)
    hermes_run_id: str | None = None
    #: the upstream of the current or last accepted attempt (SPEC S10); None: none yet, or the first upstream
    #: (accepted by a broker before S10)
    upstream: str | None = None
    hold: Hold | None = None
    #: the upstream where the current attempt's create got no answer (its run may be live there, SPEC S10)
    unanswered_on: str | None = None
    stop_requested: bool = False
    denied_command: str | None = None
    superseded_by: str | None = None  #: the later turn of its session that stopped it (SPEC S4.3 `interrupt`)
    output: str | None = None
    usage: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    dropped_deltas: int = 0
    callback_url: str | None = None  #: the create's callback URL (SPEC S5.8)


def apply(view: JobView | None, event: JobEvent) -> JobView | None:
    """Fold one event. Nothing exists before JobCreated; a terminal view absorbs everything."""
    return fold((event,), view)


def fold(events: Iterable[JobEvent], initial: JobView | None = None) -> JobView | None:
    """`events` folded onto `initial`: nothing exists before JobCreated, and a terminal view absorbs everything.
    The view is copied once for the events' count, not once per event (most events of a busy job, its deltas,
    change nothing else)."""
    view, counted = initial, 0
    for event in events:
        if view is None:
            view = _created(event) if isinstance(event, JobCreated) else None
        elif view.status.terminal:
            break  # a terminal view absorbs everything
        else:
            view, counted = _apply_live(view, event), counted + 1
    return evolve(view, event_count=view.event_count + counted) if view is not None and counted else view


def _created(event: JobCreated) -> JobView:
    return JobView(
        job_id=event.job_id,
        status=JobStatus.QUEUED,
        created_at_ms=event.at_ms,
        updated_at_ms=event.at_ms,
        fingerprint=event.fingerprint,
        idempotency_key=event.idempotency_key,
        session_key=event.session_key,
        session_id=event.session_id,
        model=event.model,
        context=event.context,
        reporting=event.reporting,
        scheduling=event.scheduling,
        callback_url=event.callback_url,
    )


def _apply_live(view: JobView, event: JobEvent) -> JobView:
    match event:
        case JobCreated() | UnknownEvent():
            return view  # a replayed create, or a newer replica's event, changes nothing
        case JobHeld(reason=reason, at_ms=at, retry_at_ms=retry_at, detail=detail, since_ms=held_since):
            since = view.hold.since_ms if view.hold else (held_since or at)
            return evolve(
                view,
                hold=Hold(reason, since, retry_at, detail),
                # a create whose answer was lost binds the attempt to its upstream until Hermes accepts it there or
                # it moves (a later refusal there says nothing of the run the lost create may have started)
                unanswered_on=event.unanswered_on or view.unanswered_on,
                hold_count=view.hold_count + 1,
                last_event="job.held",
                updated_at_ms=at,
            )
        case RunAccepted(attempt=attempt, hermes_run_id=run_id, at_ms=at, upstream=upstream):
            status = JobStatus.STOPPING if view.stop_requested else JobStatus.RUNNING
            return evolve(
                view,
                status=status,
                attempt=attempt,
                attempts=view.attempts + 1,
                accepted_attempt=attempt,
                live_since_ms=at,
                hermes_run_id=run_id,
                upstream=upstream,
                hold=None,
                unanswered_on=None,
                hold_count=0,
                approval_command=None,
                last_event="job.accepted",
                updated_at_ms=at,
            )
        case HermesEventRecorded():
            return _hermes_event(view, event)
        case DeltasDropped(count=count):
            return evolve(view, dropped_deltas=view.dropped_deltas + count)
        case RunInterrupted(at_ms=at, attempt=attempt):
            live = None if attempt == view.accepted_attempt else view.live_since_ms
            return evolve(view, last_event="job.interrupted", live_since_ms=live, updated_at_ms=at)
        case RunResubmitted(attempt=attempt, at_ms=at):
            status = JobStatus.RUNNING if view.status is JobStatus.WAITING_FOR_APPROVAL else view.status
            return evolve(
                view, status=status, attempt=attempt, hold_count=0, last_event="job.resubmitted", updated_at_ms=at
            )
        case JobRerouted(at_ms=at):
            return evolve(view, last_event="job.rerouted", unanswered_on=None, updated_at_ms=at)
        case StopRequested(at_ms=at, superseded_by=by):
            status = JobStatus.STOPPING if view.status in _ACTIVE else view.status
            return evolve(
                view,
                status=status,
                stop_requested=True,
                superseded_by=by,
                last_event="job.stop_requested",
                updated_at_ms=at,
            )
        case ApprovalDenied(command=command, at_ms=at):
            status = JobStatus.STOPPING if view.status in _ACTIVE else view.status
            return evolve(view, status=status, stop_requested=True, denied_command=command, updated_at_ms=at)
        case JobFinished():
            return _finished(view, event)
        case _:
            assert_never(event)


def _hermes_event(view: JobView, event: HermesEventRecorded) -> JobView:
    if event.attempt != view.attempt or event.hermes_run_id != view.hermes_run_id:
        return view  # a late event of a superseded attempt
    if event.name == "message.delta":
        return view  # as in Hermes, deltas move neither last_event nor updated_at
    status, command = view.status, view.approval_command
    if event.name == "approval.request":
        command = _command(event.payload)
        status = JobStatus.WAITING_FOR_APPROVAL if status in _ACTIVE else status
    elif event.name == "approval.responded" and status in _ACTIVE:
        status = JobStatus.RUNNING
    return evolve(view, status=status, approval_command=command, last_event=event.name, updated_at_ms=event.at_ms)


def _command(payload: str) -> str | None:
    try:
        command = json.loads(payload).get("command")
    except (ValueError, AttributeError):
        return None
    return command if isinstance(command, str) else None


def _finished(view: JobView, event: JobFinished) -> JobView:
    return evolve(
        view,
        status=event.status,
        hold=None,
        live_since_ms=None,
        output=event.output,
        usage=event.usage,
        error_code=event.error_code,
        error_message=event.error_message,
        last_event=f"run.{event.status.value}",
        updated_at_ms=event.at_ms,
    )
