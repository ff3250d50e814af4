"""The S6 log lines and metrics of what a driver appended: one fixed sentence per fact."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from broker.events import (
    DeltasDropped,
    HermesEventRecorded,
    JobEvent,
    JobFinished,
    JobHeld,
    JobRerouted,
    RunAccepted,
    RunInterrupted,
    RunResubmitted,
    StopRequested,
)
from broker.metrics import Metrics
from projections.job import JobView


def record(log: logging.Logger, metrics: Metrics, view: JobView, events: Sequence[JobEvent]) -> None:
    """Log and count `events`, just appended; `view` is the job after them."""
    job = view.job_id
    for event in events:
        log.debug("Appended a job event.", extra={"job": job, "event": type(event).__name__})
        match event:
            case JobHeld():
                _held(log, metrics, view, event)
            case RunAccepted(attempt=attempt, hermes_run_id=run_id):
                log.info("Hermes accepted a job.", extra={"job": job, "attempt": attempt, "hermesRun": run_id})
            case RunInterrupted(attempt=attempt, hermes_run_id=run_id, reason=reason):
                fields = {"job": job, "attempt": attempt, "hermesRun": run_id, "reason": reason}
                log.warning("Hermes interrupted a job's run.", extra=fields)
            case RunResubmitted(attempt=attempt):
                metrics.resubmits.inc()
                log.info("Resubmitted a job.", extra={"job": job, "resubmit": attempt - 1, "attempt": attempt})
            case JobRerouted(from_upstream=moved_from, to_upstream=moved_to, reason=reason):
                fields = {"job": job, "from": moved_from, "to": moved_to, "reason": reason}
                log.info("Moved a job's session to another upstream.", extra=fields)
            case StopRequested():
                log.info("Stopped a job.", extra={"job": job})
            case JobFinished(status=status, error_code=code):
                metrics.jobs_finished.labels(status.value).inc()
                fields = {
                    "job": job,
                    "status": status.value,
                    "error": code,
                    "attempts": view.attempts,
                    "hermesRun": view.hermes_run_id,
                    "durationMs": event.at_ms - view.created_at_ms,
                }
                (log.warning if status.value == "failed" else log.info)("Finished a job.", extra=fields)
            case DeltasDropped(count=count):
                if view.dropped_deltas == count:  # the first drop of this job: one warn line
                    fields = {"job": job, "dropped": count, "attempt": event.attempt}
                    log.warning("Stopped storing message deltas: the job reached RUNS_EVENTS_MAXLEN.", extra=fields)
            case HermesEventRecorded():
                pass  # relayed activity: the debug line above is enough
            case _:
                pass


def _held(log: logging.Logger, metrics: Metrics, view: JobView, event: JobHeld) -> None:
    metrics.holds.labels(event.reason.value).inc()
    if view.hold_count == 1:  # one line per hold streak of a job, not one per probe
        fields = {
            "job": view.job_id,
            "hold": event.reason.value,
            "attempt": event.attempt,
            "backoffMs": event.retry_at_ms - event.at_ms,
            "error": event.detail,
        }
        log.info("Held a job: Hermes did not accept it.", extra=fields)
