"""Every driving rule of SPEC S4, pure: (job view, fact, now) -> events to append, or the next action.

No IO, no clock, no randomness: time and jitter are inputs. The runner executes the actions and
appends the events; the fold of those events is the only state.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from attrs import frozen

from broker.admission.state import line_place
from broker.events import (
    ApprovalDenied,
    DeltasDropped,
    HermesEventRecorded,
    HoldReason,
    JobEvent,
    JobHeld,
    JobStatus,
    RunAccepted,
    RunInterrupted,
    RunResubmitted,
)
from broker.hermes.models import (
    TERMINAL_STATUSES,
    Accepted,
    Busy,
    CreateOutcome,
    Draining,
    HermesEvent,
    HermesRun,
    NotFound,
    Rejected,
    StopOutcome,
    Stopping,
    Unauthorized,
    Unavailable,
)
from broker.ids import upstream_key
from broker.jobs.policy import Policy
from broker.jobs.rules import cancelled, finished
from projections.job import JobView, apply, fold


@frozen
class Done:
    """The job is terminal: nothing left to drive."""


@frozen
class Append:
    """Append these events, then decide again."""

    events: tuple[JobEvent, ...]


@frozen
class Queue:
    """The job waits in the admission line (SPEC S4.1) until it is granted a slot, at most until `deadline_ms`."""

    place: str  #: its place in the line (arrival order; a resubmit goes to the front)
    deadline_ms: int  #: when its hold expires (RUNS_HOLD from the start of its wait)


@frozen
class Submit:
    """Ask Hermes to create the run of `attempt` with its upstream Idempotency-Key."""

    attempt: int
    idempotency_key: str


@frozen
class StopRun:
    """A stop is recorded and the attempt's Hermes run is live: stop it."""

    hermes_run_id: str


@frozen
class Follow:
    """The attempt's Hermes run is live: follow it until it settles."""

    attempt: int
    hermes_run_id: str


@frozen
class Refused:
    """A create Hermes did not accept for now: the job holds (SPEC S4 Hold)."""

    reason: HoldReason
    detail: str  #: Hermes's words, or a sentence of the broker's (SPEC S3.2 `hold.detail`)
    retry_after_ms: int | None


@frozen
class StopAnswer:
    """What Hermes's answer to a stop means for the job."""

    events: tuple[JobEvent, ...] = ()  #: the job ends now (the run is gone, or settled: the stop wins)
    sent: bool = False  #: Hermes has the stop (or refused it for good): follow the run until it settles
    retry: bool = False  #: Hermes could not be reached: ask again after a backoff


Action = Done | Append | Queue | Submit | StopRun | Follow


def next_action(
    view: JobView, now_ms: int, *, stop_sent: bool, admitted: bool, policy: Policy, turn_since_ms: int = 0
) -> Action:
    """What the owner of `view` does next.

    `stop_sent`: Hermes was already asked to stop this attempt; `admitted`: the owner holds an
    admission slot for the job, so it may create its run (SPEC S4.1); `turn_since_ms`: when the job's turn of its
    session began (SPEC S4.3: the wait for it is not a hold RUNS_HOLD expires).
    """
    if view.status.terminal:
        return Done()
    accepted = view.accepted_attempt == view.attempt and view.hermes_run_id is not None
    if not accepted:
        if view.stop_requested:
            return Append((cancelled(view, now_ms),))  # Hermes is never called for a stopped waiting job
        deadline = waiting_since(view, turn_since_ms) + policy.hold_ms
        if now_ms >= deadline:
            return Append((_hold_expired(view, now_ms, policy),))
        if not admitted:
            return Queue(line_place(view), deadline)
        return Submit(view.attempt, upstream_key(view.job_id, view.attempt))
    assert view.hermes_run_id is not None
    if view.stop_requested and not stop_sent:
        return StopRun(view.hermes_run_id)
    return Follow(view.attempt, view.hermes_run_id)


def refusal_of(outcome: CreateOutcome) -> Refused | None:
    """The hold a create answer means, or None when Hermes accepted or rejected the job itself."""
    match outcome:
        case Busy(retry_after_s=after, message=message):
            return Refused(HoldReason.BUSY, message, _ms(after))
        case Draining(retry_after_s=after, message=message):
            return Refused(HoldReason.DRAINING, message, _ms(after))
        case Unavailable(reason=reason):
            return Refused(HoldReason.UNAVAILABLE, reason, None)
        case Unauthorized(status=status, message=message):
            return Refused(HoldReason.UNAVAILABLE, message or f"Hermes answered HTTP {status}.", None)
        case _:
            return None


def on_create(
    view: JobView,
    attempt: int,
    outcome: CreateOutcome,
    now_ms: int,
    *,
    retry_at_ms: int,
    policy: Policy,
    upstream: str | None = None,
    turn_since_ms: int = 0,
) -> list[JobEvent]:
    """Hermes (`upstream`, SPEC S10) answered the create of `attempt`; a refusal holds the job until the line's
    `retry_at_ms`."""
    if view.status.terminal or attempt != view.attempt or view.accepted_attempt == attempt:
        return []
    match outcome:
        case Accepted(run_id=run_id):
            return [
                RunAccepted(job_id=view.job_id, at_ms=now_ms, attempt=attempt, hermes_run_id=run_id, upstream=upstream)
            ]
        case Rejected(message=message):
            return [finished(view, now_ms, JobStatus.FAILED, "hermes_rejected", message)]
    refused = refusal_of(outcome)
    assert refused is not None
    waited_from = waiting_since(view, turn_since_ms)
    if now_ms - waited_from >= policy.hold_ms:
        return [_hold_expired(view, now_ms, policy, refused.reason)]
    since = waited_from if view.hold is None else None
    return [
        JobHeld(
            job_id=view.job_id,
            at_ms=now_ms,
            reason=refused.reason,
            retry_at_ms=min(retry_at_ms, waited_from + policy.hold_ms),
            attempt=attempt,
            detail=refused.detail,
            since_ms=since,
            unanswered_on=upstream if isinstance(outcome, Unavailable) and outcome.unanswered else None,
        )
    ]


def on_stop(view: JobView, outcome: StopOutcome, now_ms: int) -> StopAnswer:
    """Hermes answered our stop of the attempt's run. A stop always ends the job (SPEC S3.4)."""
    if view.status.terminal:
        return StopAnswer()
    match outcome:
        case Stopping(status=status) if status in TERMINAL_STATUSES:
            return StopAnswer((cancelled(view, now_ms),))  # settled already: the stop wins
        case Stopping():
            return StopAnswer(sent=True)
        case NotFound():
            return StopAnswer((cancelled(view, now_ms),))  # Hermes no longer holds the run
        case Rejected(status=404) | Rejected(code="run_not_active"):
            return StopAnswer((cancelled(view, now_ms),))  # a Hermes that restarted: the run is not active
        case Rejected():
            return StopAnswer(sent=True)  # Hermes will not stop it: the stop wins when the run settles
        case Unavailable() | Unauthorized():
            return StopAnswer(retry=True)


def waiting_since(view: JobView, turn_since_ms: int = 0) -> int:
    """When the job's current wait for Hermes began: its hold, else its (re)entry into the line, and not before its
    turn of its session began (`turn_since_ms`, SPEC S4.3)."""
    return max(view.hold.since_ms if view.hold is not None else view.updated_at_ms, turn_since_ms)


def backoff_ms(failures: int, jitter: float, policy: Policy) -> int:
    """Exponential backoff with equal jitter for the `failures`-th consecutive failure (from 1)."""
    ceiling = min(policy.backoff_max_ms, policy.backoff_ms * 2 ** min(max(failures - 1, 0), 30))
    return int(ceiling / 2 + jitter * ceiling / 2)


def on_events(
    view: JobView, attempt: int, run_id: str, items: Sequence[HermesEvent], now_ms: int, policy: Policy
) -> list[JobEvent]:
    """A batch of Hermes events of one attempt: relay them, settle on a terminal one (the job's last event:
    the count of deltas dropped in the batch goes before it)."""
    events: list[JobEvent] = []
    if view.status.terminal or view.attempt != attempt:
        return events
    dropped = 0
    count = view.event_count  # relayed events move neither the status to terminal nor the attempt: the job
    for item in items:  # is folded (the writer folds it again) only where a fact depends on more than the count
        if item.terminal:
            current = fold(events, view) or view
            if dropped:
                counted = DeltasDropped(job_id=view.job_id, at_ms=now_ms, attempt=attempt, count=dropped)
                current = apply(current, counted) or current
                events.append(counted)
                dropped = 0
            events.extend(on_status(current, attempt, _run_from_event(run_id, item), now_ms, policy))
            break
        if item.name == "message.delta" and count >= policy.events_maxlen:
            dropped += 1
            continue
        # a deny names the command of the approval asked for, maybe earlier in this batch
        current = fold(events, view) or view if item.name == "approval.responded" else view
        new = _relay(current, attempt, run_id, item, now_ms)
        count += len(new)
        events.extend(new)
    if dropped:
        events.append(DeltasDropped(job_id=view.job_id, at_ms=now_ms, attempt=attempt, count=dropped))
    return events


def on_status(view: JobView, attempt: int, run: HermesRun | NotFound, now_ms: int, policy: Policy) -> list[JobEvent]:
    """What a GET (or a terminal event) says of the attempt's run; a live status changes nothing."""
    if view.status.terminal or attempt != view.attempt:
        return []  # a late answer of a settled or superseded attempt
    if isinstance(run, NotFound):
        return _settle_lost(view, "not_found", now_ms, policy)
    if view.stop_requested and run.terminal:
        return [cancelled(view, now_ms)]  # the stop wins over whatever Hermes says afterwards
    match run.status:
        case "completed":
            usage = orjson.dumps(run.usage).decode() if run.usage is not None else None
            return [finished(view, now_ms, JobStatus.COMPLETED, None, None, output=run.output, usage=usage)]
        case "failed":
            return [finished(view, now_ms, JobStatus.FAILED, "hermes_failed", run.error or "Hermes failed the run.")]
        case "cancelled" | "interrupted":
            return _settle_lost(view, run.status, now_ms, policy)
        case _:
            return []


def on_upstream_lost(view: JobView, attempt: int, now_ms: int, policy: Policy) -> list[JobEvent]:
    """The attempt's upstream answered nothing for HERMES_UPSTREAM_LOST (SPEC S10): its run counts as interrupted,
    and the job is resubmitted (attempt n+1, elsewhere)."""
    if view.status.terminal or attempt != view.attempt or view.accepted_attempt != attempt:
        return []
    return _settle_lost(view, "upstream_lost", now_ms, policy)


def _relay(view: JobView, attempt: int, run_id: str, item: HermesEvent, now_ms: int) -> list[JobEvent]:
    payload = orjson.dumps(item.payload).decode()
    recorded = HermesEventRecorded(
        job_id=view.job_id, at_ms=now_ms, attempt=attempt, hermes_run_id=run_id, name=item.name, payload=payload
    )
    if item.name == "approval.responded" and str(item.payload.get("choice", "")).lower() == "deny":
        command = view.approval_command or ""
        return [recorded, ApprovalDenied(job_id=view.job_id, at_ms=now_ms, attempt=attempt, command=command)]
    return [recorded]


def _run_from_event(run_id: str, item: HermesEvent) -> HermesRun:
    status = item.name.removeprefix("run.")
    error = item.payload.get("error")
    payload = {**item.payload, "run_id": run_id, "status": status, "error": error if isinstance(error, str) else None}
    return HermesRun.from_api(payload)


def _settle_lost(view: JobView, reason: str, now_ms: int, policy: Policy) -> list[JobEvent]:
    """The run is gone without an answer (Hermes restarted, or cancelled it unasked): resubmit or give up."""
    if view.stop_requested:
        return [cancelled(view, now_ms)]
    interrupted = RunInterrupted(
        job_id=view.job_id, at_ms=now_ms, attempt=view.attempt, hermes_run_id=view.hermes_run_id, reason=reason
    )
    if view.attempt - 1 < policy.resubmit:
        return [interrupted, RunResubmitted(job_id=view.job_id, at_ms=now_ms, attempt=view.attempt + 1)]
    message = f"Hermes interrupted the job's run {view.attempt} times."
    return [interrupted, finished(view, now_ms, JobStatus.FAILED, "resubmit_exhausted", message)]


def _hold_expired(view: JobView, now_ms: int, policy: Policy, reason: HoldReason | None = None) -> JobEvent:
    reason = reason or (view.hold.reason if view.hold is not None else HoldReason.BUSY)
    message = f"Hermes did not accept the job within {policy.hold_ms} ms ({reason.value})."
    return finished(view, now_ms, JobStatus.FAILED, "hold_expired", message)


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)
