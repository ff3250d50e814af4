"""Every fact a job's stream can hold: frozen attrs classes, past-tense names, epoch-ms `at_ms`.

Changes are additive only: a new field gets a default, no stored field is renamed or re-meant
(old and new replicas read each other's events during a rollout). Payloads that the broker
forwards without interpreting (the execution body, Hermes event payloads, usage) are kept as
JSON text so they round-trip byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum

from attrs import field, frozen


def thread_key(job_id: str) -> str:
    """The job's thread: one job, one thread (`runs-<job id>`), also the board key."""
    return f"runs-{job_id}"


class JobStatus(StrEnum):
    QUEUED = "queued"  #: waiting for a replica or for Hermes to accept
    RUNNING = "running"  #: Hermes accepted an attempt (also while it is resubmitted)
    WAITING_FOR_APPROVAL = "waiting_for_approval"  #: a tool call waits for /approval
    STOPPING = "stopping"  #: a stop is recorded; the Hermes run is being stopped
    COMPLETED = "completed"  #: terminal, with output and usage
    FAILED = "failed"  #: terminal, with error
    CANCELLED = "cancelled"  #: terminal: stopped, or approval denied

    @property
    def terminal(self) -> bool:
        return self in (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)


class HoldReason(StrEnum):
    BUSY = "busy"  #: Hermes answered 429
    DRAINING = "draining"  #: Hermes answered 503 gateway_draining
    UNAVAILABLE = "unavailable"  #: refused, timeout, other 5xx, 401/403
    #: an earlier turn of its session is queued or live (SPEC S4.3). Shown, never stored: derived on read from the
    #: session's turns, so an older replica never reads a reason it does not know
    SESSION = "session"
    #: its key is at its `live` quota, or spent its token budget (SPEC S4.4). Shown, never stored: derived on read
    #: from the key's held jobs (broker/store/quota.py)
    QUOTA = "quota"
    BUDGET = "budget"


@frozen
class Link:
    text: str
    url: str


def _links(links: Iterable[Link] | None) -> tuple[Link, ...] | None:
    return None if links is None else tuple(links)


@frozen
class Context:
    """Display-only source context of a create (SPEC S3.1.2); `None` parts were absent."""

    title: str
    url: str | None = None
    links: tuple[Link, ...] | None = field(default=None, converter=_links)


@frozen
class Reporting:
    """Resolved reporting flags (SPEC S3.1.3); a job stored without them keeps both true."""

    board: bool = True
    post: bool = True


@frozen(kw_only=True)
class Scheduling:
    """A job's resolved place in the line (SPEC S4.2): its priority, fairness key and weight.

    A job stored before scheduling existed reads as these defaults (priority 3, the empty key, weight 1).
    """

    priority: int = 3  #: 1 goes first
    fairness_key: str = ""  #: every job without a key shares the empty key
    fairness_weight: float = 1.0  #: each job advances its key's turn by 1/weight
    #: what a turn does while an earlier job of its session is queued or live (SPEC S4.3): `enqueue`, `reject`,
    #: `interrupt` or `parallel`. Stored jobs without it (created before S4.3) read as `parallel`, which they were.
    multitask: str = "parallel"


@frozen(kw_only=True)
class JobCreated:
    job_id: str
    at_ms: int
    body: str  #: the execution body as JSON text, forwarded to Hermes unchanged
    fingerprint: str  #: sha256 of input + instructions (SPEC S3.1.1)
    idempotency_key: str | None = None
    session_key: str | None = None  #: X-Hermes-Session-Key, forwarded on every attempt
    session_id: str | None = None
    model: str | None = None
    context: Context | None = None
    reporting: Reporting = field(factory=Reporting)
    #: W3C trace context of the create's span (SPEC S6.1): every later span of the job is its child;
    #: None: the create was not traced.
    traceparent: str | None = None
    scheduling: Scheduling = field(factory=Scheduling)  #: absent from events written before S4.2
    #: the session's earlier completed turns go to Hermes as `conversation_history` (SPEC S4.3)
    session_history: bool = False
    callback_url: str | None = None  #: where the job's callbacks go (SPEC S5.8); None: it has none


@frozen(kw_only=True)
class JobHeld:
    """Hermes did not accept the job (busy, draining, down); it is retried at `retry_at_ms`."""

    job_id: str
    at_ms: int
    reason: HoldReason
    retry_at_ms: int
    attempt: int = 1  #: the attempt Hermes was asked to create
    detail: str | None = None  #: Hermes's words for the refusal, or a sentence of the broker's (SPEC S3.2)
    #: When the job began to wait (it entered the line), if before this first refusal; None: at `at_ms`.
    since_ms: int | None = None
    #: The upstream the create went to when its answer was lost (a timeout, a reset): its run may be live there, so
    #: the attempt stays bound to it until it answers or is lost (SPEC S10). None: Hermes answered, or never got it.
    unanswered_on: str | None = None


@frozen(kw_only=True)
class RunAccepted:
    job_id: str
    at_ms: int
    attempt: int
    hermes_run_id: str
    #: the upstream that accepted the run, by name (SPEC S10); None: a broker before S10 wrote it (the first upstream)
    upstream: str | None = None


@frozen(kw_only=True)
class HermesEventRecorded:
    """A non-terminal event relayed from the Hermes run of `attempt`."""

    job_id: str
    at_ms: int
    attempt: int
    hermes_run_id: str
    name: str  #: Hermes's `event` field
    payload: str  #: the Hermes payload as JSON text, exactly as received


@frozen(kw_only=True)
class DeltasDropped:
    """`count` more message.delta events were not stored (RUNS_EVENTS_MAXLEN reached)."""

    job_id: str
    at_ms: int
    attempt: int
    count: int


@frozen(kw_only=True)
class RunInterrupted:
    job_id: str
    at_ms: int
    attempt: int
    hermes_run_id: str | None
    reason: str  #: not_found | interrupted | cancelled


@frozen(kw_only=True)
class RunResubmitted:
    job_id: str
    at_ms: int
    attempt: int  #: the new attempt number


@frozen(kw_only=True)
class JobRerouted:
    """The job's session moved to another upstream: its own was down past HERMES_AFFINITY_GRACE (SPEC S10)."""

    job_id: str
    at_ms: int
    from_upstream: str
    to_upstream: str
    reason: str  #: why it moved: the down upstream's refusal reason (`unavailable`, `draining`), `lost` or `removed`


@frozen(kw_only=True)
class StopRequested:
    job_id: str
    at_ms: int
    #: the later turn of its session that interrupted it (SPEC S4.3 `interrupt`); None: a caller's stop
    superseded_by: str | None = None


@frozen(kw_only=True)
class ApprovalDenied:
    job_id: str
    at_ms: int
    attempt: int
    command: str


@frozen(kw_only=True)
class JobFinished:
    """The job's one terminal fact; nothing changes it afterwards."""

    job_id: str
    at_ms: int
    status: JobStatus
    attempt: int = 0
    output: str | None = None
    usage: str | None = None  #: JSON text of Hermes's usage object
    error_code: str | None = None
    error_message: str | None = None
    #: The last known real activity when the finish was learnt afterwards (board repair, SPEC S5.6);
    #: None: the finish itself is the activity, at `at_ms`.
    source_at_ms: int | None = None


@frozen
class UnknownEvent:
    """An event a newer replica wrote; every projection treats it as a no-op."""


JobEvent = (
    JobCreated
    | JobHeld
    | RunAccepted
    | HermesEventRecorded
    | DeltasDropped
    | RunInterrupted
    | RunResubmitted
    | JobRerouted
    | StopRequested
    | ApprovalDenied
    | JobFinished
    | UnknownEvent
)
