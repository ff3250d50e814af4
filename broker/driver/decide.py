"""Every driving rule of SPEC S4, pure: (job view, fact, now) -> events to append, or the next action.

No IO, no clock, no randomness: time and jitter are inputs. The runner executes the actions and
appends the events; the fold of those events is the only state.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from attrs import frozen

from broker.config import Config
from broker.events import (
    ApprovalDenied,
    DeltasDropped,
    HermesEventRecorded,
    HoldReason,
    JobEvent,
    JobFinished,
    JobHeld,
    JobStatus,
    RunAccepted,
    RunInterrupted,
    RunResubmitted,
)
from broker.hermes.models import (
    Accepted,
    Busy,
    CreateOutcome,
    Draining,
    HermesEvent,
    HermesRun,
    NotFound,
    Rejected,
    Unauthorized,
    Unavailable,
)
from broker.ids import upstream_key
from projections.job import JobView, apply


@frozen(kw_only=True)
class Policy:
    """The S2 numbers the rules depend on (milliseconds)."""

    hold_ms: int = 2_400_000
    resubmit: int = 3
    backoff_ms: int = 1_000
    backoff_max_ms: int = 30_000
    events_maxlen: int = 100_000

    @classmethod
    def from_config(cls, config: Config) -> Policy:
        return cls(
            hold_ms=config.runs_hold_ms,
            resubmit=config.runs_resubmit,
            backoff_ms=config.runs_backoff_ms,
            backoff_max_ms=config.runs_backoff_max_ms,
            events_maxlen=config.runs_events_maxlen,
        )


@frozen
class Done:
    """The job is terminal: nothing left to drive."""


@frozen
class Append:
    """Append these events, then decide again."""

    events: tuple[JobEvent, ...]


@frozen
class Wait:
    """Nothing to do before `until_ms` (hold backoff)."""

    until_ms: int


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


Action = Done | Append | Wait | Submit | StopRun | Follow


def next_action(view: JobView, now_ms: int, *, stop_sent: bool) -> Action:
    """What the owner of `view` does next; `stop_sent`: Hermes was already asked to stop this attempt."""
    if view.status.terminal:
        return Done()
    accepted = view.accepted_attempt == view.attempt and view.hermes_run_id is not None
    if not accepted:
        if view.stop_requested:
            return Append((_cancelled(view, now_ms),))  # Hermes is never called for a stopped waiting job
        if view.hold is not None and now_ms < view.hold.retry_at_ms:
            return Wait(view.hold.retry_at_ms)
        return Submit(view.attempt, upstream_key(view.job_id, view.attempt))
    assert view.hermes_run_id is not None
    if view.stop_requested and not stop_sent:
        return StopRun(view.hermes_run_id)
    return Follow(view.attempt, view.hermes_run_id)


def on_create(
    view: JobView, attempt: int, outcome: CreateOutcome, now_ms: int, jitter: float, policy: Policy
) -> list[JobEvent]:
    """Hermes answered the create of `attempt`; `jitter` is uniform in [0, 1)."""
    if view.status.terminal or attempt != view.attempt or view.accepted_attempt == attempt:
        return []
    match outcome:
        case Accepted(run_id=run_id):
            return [RunAccepted(job_id=view.job_id, at_ms=now_ms, attempt=attempt, hermes_run_id=run_id)]
        case Rejected(message=message):
            return [_finished(view, now_ms, JobStatus.FAILED, "hermes_rejected", message)]
        case Busy(retry_after_s=after):
            return [_held(view, now_ms, HoldReason.BUSY, after, None, jitter, policy)]
        case Draining(retry_after_s=after):
            return [_held(view, now_ms, HoldReason.DRAINING, after, None, jitter, policy)]
        case Unavailable(reason=reason):
            return [_held(view, now_ms, HoldReason.UNAVAILABLE, None, reason, jitter, policy)]
        case Unauthorized(status=status):
            return [_held(view, now_ms, HoldReason.UNAVAILABLE, None, f"HTTP {status}", jitter, policy)]


def on_events(
    view: JobView, attempt: int, run_id: str, items: Sequence[HermesEvent], now_ms: int, policy: Policy
) -> list[JobEvent]:
    """A batch of Hermes events of one attempt: relay them, settle on a terminal one."""
    events: list[JobEvent] = []
    dropped = 0
    current: JobView | None = view
    for item in items:
        if current is None or current.status.terminal or current.attempt != attempt:
            break
        if item.terminal:
            events.extend(on_status(current, attempt, _run_from_event(run_id, item), now_ms, policy))
            break
        if item.name == "message.delta" and current.event_count >= policy.events_maxlen:
            dropped += 1
            continue
        new = _relay(current, attempt, run_id, item, now_ms)
        for event in new:
            current = apply(current, event)
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
        return [_cancelled(view, now_ms)]  # the stop wins over whatever Hermes says afterwards
    match run.status:
        case "completed":
            usage = orjson.dumps(run.usage).decode() if run.usage is not None else None
            return [_finished(view, now_ms, JobStatus.COMPLETED, None, None, output=run.output, usage=usage)]
        case "failed":
            return [_finished(view, now_ms, JobStatus.FAILED, "hermes_failed", run.error or "Hermes failed the run.")]
        case "cancelled" | "interrupted":
            return _settle_lost(view, run.status, now_ms, policy)
        case _:
            return []


def on_stop(view: JobView, outcome_not_found: bool, now_ms: int) -> list[JobEvent]:
    """Hermes answered our stop; a run it no longer knows is as good as stopped."""
    if view.status.terminal or not outcome_not_found:
        return []
    return [_cancelled(view, now_ms)]


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
        return [_cancelled(view, now_ms)]
    interrupted = RunInterrupted(
        job_id=view.job_id, at_ms=now_ms, attempt=view.attempt, hermes_run_id=view.hermes_run_id, reason=reason
    )
    if view.attempt - 1 < policy.resubmit:
        return [interrupted, RunResubmitted(job_id=view.job_id, at_ms=now_ms, attempt=view.attempt + 1)]
    message = f"Hermes interrupted the job's run {view.attempt} times."
    return [interrupted, _finished(view, now_ms, JobStatus.FAILED, "resubmit_exhausted", message)]


def _held(
    view: JobView,
    now_ms: int,
    reason: HoldReason,
    retry_after_s: float | None,
    detail: str | None,
    jitter: float,
    policy: Policy,
) -> JobEvent:
    since = view.hold.since_ms if view.hold is not None else now_ms
    if now_ms - since >= policy.hold_ms:
        message = f"Hermes did not accept the job within {policy.hold_ms} ms ({reason.value})."
        return _finished(view, now_ms, JobStatus.FAILED, "hold_expired", message)
    return JobHeld(
        job_id=view.job_id,
        at_ms=now_ms,
        reason=reason,
        retry_at_ms=retry_at(view.hold_count, since, now_ms, retry_after_s, jitter, policy),
        attempt=view.attempt,
        detail=detail,
    )


def retry_at(holds: int, since_ms: int, now_ms: int, retry_after_s: float | None, jitter: float, policy: Policy) -> int:
    """Exponential backoff with equal jitter, never shorter than Retry-After, never past the hold deadline."""
    ceiling = min(policy.backoff_max_ms, policy.backoff_ms * 2 ** min(holds, 30))
    delay = ceiling / 2 + jitter * ceiling / 2
    if retry_after_s is not None:
        delay = max(delay, retry_after_s * 1000)
    return min(now_ms + int(delay), since_ms + policy.hold_ms)


def _cancelled(view: JobView, now_ms: int) -> JobEvent:
    if view.denied_command is not None:
        return _finished(view, now_ms, JobStatus.CANCELLED, "approval_denied", view.denied_command)
    return _finished(view, now_ms, JobStatus.CANCELLED, "stopped", "The job was stopped by request.")


def _finished(
    view: JobView,
    now_ms: int,
    status: JobStatus,
    code: str | None,
    message: str | None,
    *,
    output: str | None = None,
    usage: str | None = None,
) -> JobEvent:
    return JobFinished(
        job_id=view.job_id,
        at_ms=now_ms,
        status=status,
        attempt=view.attempt,
        output=output,
        usage=usage,
        error_code=code,
        error_message=message,
    )
