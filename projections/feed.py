"""The SSE feed of a job (SPEC S3.3): each stored event rendered to the payload a client sees. Pure; no IO.

Broker events use the `job.` prefix; Hermes events keep Hermes's payload with `run_id` rewritten to the
job id and `hermes_run_id`/`attempt` added; `JobFinished` is the one terminal `run.*` event. A job's feed
ends at its first terminal event (`shown` stops there), so a client sees exactly one.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar, assert_never

from broker.events import (
    ApprovalDenied,
    DeltasDropped,
    HermesEventRecorded,
    JobCreated,
    JobEvent,
    JobFinished,
    JobHeld,
    JobRerouted,
    JobStatus,
    RunAccepted,
    RunInterrupted,
    RunResubmitted,
    StopRequested,
    UnknownEvent,
)

Payload = dict[str, Any]
Id = TypeVar("Id")

#: Hermes event names that end a Hermes run; the job's own end is `JobFinished`, so these are never relayed.
HERMES_TERMINAL = frozenset({"run.completed", "run.failed", "run.cancelled", "run.interrupted"})


def is_terminal(event: JobEvent) -> bool:
    """True for the event that ends a job's feed."""
    return isinstance(event, JobFinished)


def payload(job_id: str, event: JobEvent) -> Payload | None:
    """The SSE payload of one stored event, or None when the feed does not show it."""
    match event:
        case JobCreated(at_ms=at):
            return _broker("job.queued", job_id, at)
        case JobHeld(at_ms=at):
            fields = {
                "reason": event.reason.value,
                "retry_at": event.retry_at_ms / 1000,
                "attempt": event.attempt,
                "detail": event.detail,
            }
            return _broker("job.held", job_id, at, fields)
        case RunAccepted(at_ms=at):
            fields = {"hermes_run_id": event.hermes_run_id, "attempt": event.attempt}
            if event.upstream is not None:
                fields["upstream"] = event.upstream  # SPEC S10
            return _broker("job.accepted", job_id, at, fields)
        case HermesEventRecorded():
            return _hermes(job_id, event)
        case RunInterrupted(at_ms=at):
            return _broker("job.interrupted", job_id, at, {"attempt": event.attempt, "reason": event.reason})
        case RunResubmitted(at_ms=at):
            return _broker("job.resubmitted", job_id, at, {"attempt": event.attempt})
        case JobRerouted(at_ms=at):
            moved = {"from": event.from_upstream, "to": event.to_upstream, "reason": event.reason}
            return _broker("job.rerouted", job_id, at, moved)
        case StopRequested(at_ms=at):
            return _broker("job.stop_requested", job_id, at)
        case JobFinished():
            return _finished(job_id, event)
        case DeltasDropped() | ApprovalDenied() | UnknownEvent():
            return None
        case _:
            assert_never(event)


def shown(job_id: str, entries: Iterable[tuple[Id, JobEvent]]) -> Iterator[tuple[Id, Payload, bool]]:
    """`(id, payload, terminal)` of each shown entry, in order, up to and including the first terminal one."""
    for entry_id, event in entries:
        document = payload(job_id, event)
        if document is not None:
            terminal = is_terminal(event)
            yield entry_id, document, terminal
            if terminal:
                return


def _broker(name: str, job_id: str, at_ms: int, fields: Payload | None = None) -> Payload:
    return {"event": name, "run_id": job_id, "timestamp": at_ms / 1000, **(fields or {})}


def _hermes(job_id: str, event: HermesEventRecorded) -> Payload | None:
    if event.name in HERMES_TERMINAL:
        return None  # a Hermes run's end is the job's JobFinished (or an interrupt), never a second terminal
    document = _json_object(event.payload)
    if document is None:
        document = {"event": event.name}  # unreadable stored payload: still show that it happened
    document["event"] = event.name  # the name the driver classified it by, even if the payload disagrees
    document["run_id"] = job_id
    document.setdefault("timestamp", event.at_ms / 1000)
    document["hermes_run_id"] = event.hermes_run_id
    document["attempt"] = event.attempt
    return document


def _finished(job_id: str, event: JobFinished) -> Payload:
    if event.status is JobStatus.COMPLETED:
        usage = _json_value(event.usage) if event.usage else None
        return _broker("run.completed", job_id, event.at_ms, {"output": event.output, "usage": usage})
    name = "run.cancelled" if event.status is JobStatus.CANCELLED else "run.failed"
    error = {"code": event.error_code, "message": event.error_message or ""} if event.error_code else None
    return _broker(name, job_id, event.at_ms, {"error": error})


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _json_object(text: str) -> Payload | None:
    value = _json_value(text)
    return value if isinstance(value, dict) else None
