"""Hypothesis strategies for the events of one job, shared by unit, integration and e2e tests.

`histories()` builds plausible streams: JobCreated first, then holds, accepts with growing
attempts, Hermes events (of the current attempt and of superseded ones), interrupts,
resubmits, stops, denials, unknown events and terminal facts, in any order a buggy or racing
driver could write them. `any_event()` draws one event of any type, for codec round trips.
"""

from __future__ import annotations

import orjson
from hypothesis import strategies as st

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
    Link,
    Reporting,
    RunAccepted,
    RunInterrupted,
    RunResubmitted,
    Scheduling,
    StopRequested,
    UnknownEvent,
)

JOB_ID = "job_0123456789abcdef0123456789abcdef"
BASE_MS = 1_796_005_747_391
TERMINAL = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)
HERMES_EVENT_NAMES = (
    "message.delta",
    "tool.started",
    "tool.completed",
    "reasoning.available",
    "approval.request",
    "approval.responded",
    "todo.updated",
)

at_ms = st.integers(min_value=BASE_MS, max_value=BASE_MS + 10_000_000)
attempts = st.integers(min_value=1, max_value=4)
texts = st.text(max_size=20)
run_ids = st.sampled_from(["run_a", "run_b", "run_c", "run_d"])
urls = st.sampled_from(["https://example.com/a", "http://example.org/x?y=1", "https://h/é"])
json_text = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
).map(lambda value: orjson.dumps(value).decode())

links = st.builds(Link, text=st.text(min_size=1, max_size=100), url=urls)
contexts = st.builds(
    Context,
    title=st.text(min_size=1, max_size=500),
    url=st.none() | urls,
    links=st.none() | st.lists(links, max_size=10).map(tuple),
)
reportings = st.builds(Reporting, board=st.booleans(), post=st.booleans())
schedulings = st.builds(
    Scheduling,
    priority=st.integers(1, 5),
    fairness_key=st.just("") | texts,
    fairness_weight=st.floats(min_value=1e-6, max_value=1_000, allow_nan=False),
)


traceparents = st.builds(
    "00-{}-{}-{}".format,
    st.text(alphabet="0123456789abcdef", min_size=32, max_size=32),
    st.text(alphabet="0123456789abcdef", min_size=16, max_size=16),
    st.sampled_from(["00", "01"]),
)


def created(job_id: str = JOB_ID) -> st.SearchStrategy[JobCreated]:
    return st.builds(
        JobCreated,
        job_id=st.just(job_id),
        at_ms=at_ms,
        body=json_text,
        fingerprint=st.text(alphabet="0123456789abcdef", min_size=64, max_size=64),
        idempotency_key=st.none() | st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1),
        session_key=st.none() | texts,
        session_id=st.none() | st.text(min_size=1, max_size=256),
        model=st.none() | texts,
        context=st.none() | contexts,
        reporting=reportings,
        traceparent=st.none() | traceparents,
        scheduling=schedulings,
    )


def finished(job_id: str = JOB_ID) -> st.SearchStrategy[JobFinished]:
    return st.builds(
        JobFinished,
        job_id=st.just(job_id),
        at_ms=at_ms,
        status=st.sampled_from(TERMINAL),
        attempt=attempts,
        output=st.none() | texts,
        usage=st.none() | json_text,
        error_code=st.none() | st.sampled_from(["hermes_failed", "hold_expired", "stopped", "approval_denied"]),
        error_message=st.none() | texts,
    )


def hermes_event(job_id: str = JOB_ID) -> st.SearchStrategy[HermesEventRecorded]:
    return st.builds(
        HermesEventRecorded,
        job_id=st.just(job_id),
        at_ms=at_ms,
        attempt=attempts,
        hermes_run_id=run_ids,
        name=st.sampled_from(HERMES_EVENT_NAMES) | texts,
        payload=json_text,
    )


def by_type(job_id: str = JOB_ID) -> dict[type, st.SearchStrategy[JobEvent]]:
    """One strategy per event class (JobCreated included), for per-type round trips."""
    j = st.just(job_id)
    return {
        JobCreated: created(job_id),
        JobHeld: st.builds(
            JobHeld,
            job_id=j,
            at_ms=at_ms,
            reason=st.sampled_from(HoldReason),
            retry_at_ms=at_ms,
            attempt=attempts,
            detail=st.none() | texts,
        ),
        RunAccepted: st.builds(
            RunAccepted,
            job_id=j,
            at_ms=at_ms,
            attempt=attempts,
            hermes_run_id=run_ids,
            upstream=st.sampled_from([None, "hermes-1:8642", "hermes-2:8642/agent"]),  # None: before SPEC S10
        ),
        HermesEventRecorded: hermes_event(job_id),
        DeltasDropped: st.builds(DeltasDropped, job_id=j, at_ms=at_ms, attempt=attempts, count=st.integers(0, 1000)),
        RunInterrupted: st.builds(
            RunInterrupted,
            job_id=j,
            at_ms=at_ms,
            attempt=attempts,
            hermes_run_id=st.none() | run_ids,
            reason=st.sampled_from(["not_found", "interrupted", "cancelled"]),
        ),
        RunResubmitted: st.builds(RunResubmitted, job_id=j, at_ms=at_ms, attempt=attempts),
        JobRerouted: st.builds(
            JobRerouted,
            job_id=j,
            at_ms=at_ms,
            from_upstream=st.sampled_from(["hermes-1:8642", "h2"]),
            to_upstream=st.sampled_from(["hermes-3:8642", "h4/agent"]),
            reason=st.sampled_from(["unavailable", "draining", "lost", "removed"]),
        ),
        StopRequested: st.builds(StopRequested, job_id=j, at_ms=at_ms),
        ApprovalDenied: st.builds(ApprovalDenied, job_id=j, at_ms=at_ms, attempt=attempts, command=texts),
        JobFinished: finished(job_id),
        UnknownEvent: st.just(UnknownEvent()),
    }


def later_event(job_id: str = JOB_ID) -> st.SearchStrategy[JobEvent]:
    """Any event that may follow JobCreated in one job's stream (JobCreated replays included)."""
    strategies = by_type(job_id)
    # Hermes events are the bulk of a real stream: weight them up.
    return st.one_of(*strategies.values(), strategies[HermesEventRecorded], strategies[HermesEventRecorded])


def any_event(job_id: str = JOB_ID) -> st.SearchStrategy[JobEvent]:
    return st.one_of(created(job_id), later_event(job_id))


def histories(job_id: str = JOB_ID, max_size: int = 25) -> st.SearchStrategy[list[JobEvent]]:
    """A stream that starts with JobCreated (most of the time) and continues with anything."""
    return st.builds(
        lambda first, rest: [first, *rest],
        created(job_id),
        st.lists(later_event(job_id), max_size=max_size),
    )


def event_lists(job_id: str = JOB_ID, max_size: int = 25) -> st.SearchStrategy[list[JobEvent]]:
    """Any events at all, JobCreated possibly absent or late."""
    return st.lists(any_event(job_id), max_size=max_size)
