"""Rules of the commands a caller gives a job (SPEC S3.4): pure, no IO; the driver's rules build on them."""

from __future__ import annotations

from broker.events import JobEvent, JobFinished, JobStatus, StopRequested
from projections.job import JobView, apply


def on_stop_request(view: JobView, now_ms: int, *, superseded_by: str | None = None) -> list[JobEvent]:
    """A caller asked to stop the job (SPEC S3.4), or a later turn of its session interrupted it (`superseded_by`,
    S4.3): record it; a job with no live Hermes run ends at once."""
    if view.status.terminal or view.stop_requested:
        return []
    stop = StopRequested(job_id=view.job_id, at_ms=now_ms, superseded_by=superseded_by)
    after = apply(view, stop)
    assert after is not None
    if after.accepted_attempt == after.attempt and after.hermes_run_id is not None:
        return [stop]
    return [stop, cancelled(after, now_ms)]


def cancelled(view: JobView, now_ms: int) -> JobEvent:
    """How a stop ends a job: `cancelled` with `stopped`, or `approval_denied` when a denied approval stopped it."""
    if view.denied_command is not None:
        return finished(view, now_ms, JobStatus.CANCELLED, "approval_denied", view.denied_command)
    if view.superseded_by is not None:
        message = f"A later turn of its session interrupted it: {view.superseded_by}."
        return finished(view, now_ms, JobStatus.CANCELLED, "superseded", message)
    return finished(view, now_ms, JobStatus.CANCELLED, "stopped", "The job was stopped by request.")


def finished(
    view: JobView,
    now_ms: int,
    status: JobStatus,
    code: str | None,
    message: str | None,
    *,
    output: str | None = None,
    usage: str | None = None,
) -> JobEvent:
    """The job's one terminal fact."""
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
