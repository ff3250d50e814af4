"""What a job write owes the job's callback URL, and when a failed delivery is tried again (SPEC S5.8).

Pure: no IO, no clock; the caller gives the time and the randomness. A delivery is owed for each transition
into a terminal status and into `waiting_for_approval`, with the job object as it is right after that event.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

import orjson
from attrs import frozen

from broker.events import JobEvent, JobStatus
from projections.job import JobView, apply

FIRST_RETRY_MS = 5_000  #: the first retry comes within this long
MAX_RETRY_MS = 600_000  #: retries back off (doubling, with jitter) up to this pause


class CallbackType(StrEnum):
    COMPLETED = "job.completed"
    FAILED = "job.failed"
    CANCELLED = "job.cancelled"
    APPROVAL_REQUESTED = "job.approval_requested"


_TERMINAL = {
    JobStatus.COMPLETED: CallbackType.COMPLETED,
    JobStatus.FAILED: CallbackType.FAILED,
    JobStatus.CANCELLED: CallbackType.CANCELLED,
}


@frozen
class Delivery:
    """One callback owed: its Standard Webhooks message id and the exact body every attempt sends."""

    webhook_id: str
    body: bytes


def webhook_id(job_id: str, kind: CallbackType, attempt: int) -> str:
    """`<job id>:<type>:<attempt>`: the same for every retry of one delivery, so receivers deduplicate on it."""
    return f"{job_id}:{kind.value}:{attempt}"


def owed(before: JobView, events: Sequence[JobEvent], render: Callable[[JobView], dict[str, Any]]) -> list[Delivery]:
    """The deliveries `events` cause, in order (none for a job without a callback); `render` gives the job
    object."""
    deliveries: list[Delivery] = []
    if before.callback_url is None:
        return deliveries
    view = before
    for event in events:
        after = apply(view, event)
        if after is None:
            continue
        kind = _transition(view.status, after.status)
        if kind is not None:
            body = {"type": kind.value, "created_at": after.updated_at_ms, "data": render(after)}
            deliveries.append(Delivery(webhook_id(after.job_id, kind, after.attempt), orjson.dumps(body)))
        view = after
    return deliveries


def _transition(before: JobStatus, after: JobStatus) -> CallbackType | None:
    if before is after or before.terminal:
        return None
    if after.terminal:
        return _TERMINAL[after]
    return CallbackType.APPROVAL_REQUESTED if after is JobStatus.WAITING_FOR_APPROVAL else None


def retry_in_ms(failures: int, jitter: float, retry_after_ms: int | None = None) -> int:
    """The pause after `failures` failed attempts of one delivery: FIRST_RETRY_MS doubling up to MAX_RETRY_MS,
    scaled by `jitter` (0..1) into its upper half; never shorter than the receiver's Retry-After."""
    ceiling = min(MAX_RETRY_MS, FIRST_RETRY_MS << min(max(0, failures - 1), 20))
    pause = int(ceiling * (0.5 + jitter / 2))
    return max(pause, retry_after_ms or 0)


@frozen(kw_only=True)
class CallbackSettings:
    """What a job write needs to owe callbacks: the job object's renderer and how long the hash lives."""

    render: Callable[[JobView], dict[str, Any]]  #: the job object (SPEC S3.2) of a view
    retention_ms: int  #: RUNS_RETENTION
    retry_window_ms: int  #: CALLBACK_RETRY_WINDOW
    #: called after a write owed a delivery: wakes this replica's sender (others find it on their next round)
    owed: Callable[[], None] = lambda: None

    @property
    def ttl_ms(self) -> int:
        """The hash outlives the job's end by its retention, and at least by one retry window."""
        return max(self.retention_ms, self.retry_window_ms)
