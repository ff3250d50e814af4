"""The SSE feed mapping (SPEC S3.3): one payload per shown event, exactly one terminal event per history."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.events import (
    ApprovalDenied,
    DeltasDropped,
    HermesEventRecorded,
    HoldReason,
    JobCreated,
    JobEvent,
    JobFinished,
    JobHeld,
    JobStatus,
    RunAccepted,
    RunInterrupted,
    RunResubmitted,
    StopRequested,
    UnknownEvent,
)
from projections.feed import is_terminal, payload, shown
from tests.strategies import JOB_ID, any_event, finished, histories

AT = 1_796_005_750_862
TS = 1_796_005_750.862
TERMINAL_NAMES = {"run.completed", "run.failed", "run.cancelled"}


def test_created_is_job_queued() -> None:
    event = JobCreated(job_id=JOB_ID, at_ms=AT, body="{}", fingerprint="f")
    assert payload(JOB_ID, event) == {"event": "job.queued", "run_id": JOB_ID, "timestamp": TS}


def test_held_carries_reason_retry_time_attempt_and_detail() -> None:
    event = JobHeld(job_id=JOB_ID, at_ms=AT, reason=HoldReason.BUSY, retry_at_ms=AT + 2500, attempt=2, detail="Full.")
    assert payload(JOB_ID, event) == {
        "event": "job.held",
        "run_id": JOB_ID,
        "timestamp": TS,
        "reason": "busy",
        "retry_at": 1_796_005_753.362,
        "attempt": 2,
        "detail": "Full.",
    }


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (
            RunAccepted(job_id=JOB_ID, at_ms=AT, attempt=1, hermes_run_id="run_a"),
            {"event": "job.accepted", "hermes_run_id": "run_a", "attempt": 1},
        ),
        (
            RunInterrupted(job_id=JOB_ID, at_ms=AT, attempt=1, hermes_run_id="run_a", reason="not_found"),
            {"event": "job.interrupted", "attempt": 1, "reason": "not_found"},
        ),
        (RunResubmitted(job_id=JOB_ID, at_ms=AT, attempt=2), {"event": "job.resubmitted", "attempt": 2}),
        (StopRequested(job_id=JOB_ID, at_ms=AT), {"event": "job.stop_requested"}),
    ],
)
def test_lifecycle_events_use_the_job_prefix(event: JobEvent, expected: dict[str, object]) -> None:
    assert payload(JOB_ID, event) == {"run_id": JOB_ID, "timestamp": TS, **expected}


def test_hermes_event_keeps_its_payload_with_the_job_id() -> None:
    hermes = {"event": "tool.started", "run_id": "run_a", "timestamp": 1796005790.0769653, "tool": "terminal"}
    event = HermesEventRecorded(
        job_id=JOB_ID,
        at_ms=AT,
        attempt=2,
        hermes_run_id="run_a",
        name="tool.started",
        payload=orjson.dumps(hermes).decode(),
    )
    document = payload(JOB_ID, event)
    assert document == {**hermes, "run_id": JOB_ID, "hermes_run_id": "run_a", "attempt": 2}
    assert document is not None and list(document)[:4] == ["event", "run_id", "timestamp", "tool"]


def test_hermes_event_with_an_unreadable_payload_still_shows() -> None:
    event = HermesEventRecorded(job_id=JOB_ID, at_ms=AT, attempt=1, hermes_run_id="run_a", name="x.y", payload="[1")
    assert payload(JOB_ID, event) == {
        "event": "x.y",
        "run_id": JOB_ID,
        "timestamp": TS,
        "hermes_run_id": "run_a",
        "attempt": 1,
    }


def test_a_relayed_hermes_terminal_is_never_shown() -> None:
    body = '{"event": "run.completed", "run_id": "run_a", "timestamp": 1.0}'
    event = HermesEventRecorded(
        job_id=JOB_ID, at_ms=AT, attempt=1, hermes_run_id="run_a", name="run.completed", payload=body
    )
    assert payload(JOB_ID, event) is None


def test_completed_carries_output_and_parsed_usage() -> None:
    event = JobFinished(
        job_id=JOB_ID, at_ms=AT, status=JobStatus.COMPLETED, attempt=1, output="Hi", usage='{"total_tokens": 3}'
    )
    assert payload(JOB_ID, event) == {
        "event": "run.completed",
        "run_id": JOB_ID,
        "timestamp": TS,
        "output": "Hi",
        "usage": {"total_tokens": 3},
    }
    assert is_terminal(event)


@pytest.mark.parametrize(
    ("status", "name", "code", "message"),
    [
        (JobStatus.FAILED, "run.failed", "hermes_failed", "HTTP 400: boom"),
        (JobStatus.CANCELLED, "run.cancelled", "stopped", "Stopped by request."),
        (JobStatus.CANCELLED, "run.cancelled", "approval_denied", "rm -rf /"),
    ],
)
def test_failed_and_cancelled_carry_the_job_error(status: JobStatus, name: str, code: str, message: str) -> None:
    event = JobFinished(job_id=JOB_ID, at_ms=AT, status=status, error_code=code, error_message=message)
    assert payload(JOB_ID, event) == {
        "event": name,
        "run_id": JOB_ID,
        "timestamp": TS,
        "error": {"code": code, "message": message},
    }


@pytest.mark.parametrize(
    "event",
    [
        DeltasDropped(job_id=JOB_ID, at_ms=AT, attempt=1, count=5),
        ApprovalDenied(job_id=JOB_ID, at_ms=AT, attempt=1, command="rm"),
        UnknownEvent(),
    ],
)
def test_bookkeeping_events_are_not_shown(event: JobEvent) -> None:
    assert payload(JOB_ID, event) is None
    assert not is_terminal(event)


@given(any_event())
def test_every_shown_payload_has_event_job_id_and_float_timestamp(event: JobEvent) -> None:
    document = payload(JOB_ID, event)
    if document is not None:
        assert isinstance(document["event"], str)
        assert document["run_id"] == JOB_ID
        assert isinstance(document["timestamp"], float | int)
        orjson.dumps(document)  # always serialisable


@given(histories(), finished(), histories())
def test_a_finished_history_shows_exactly_one_terminal_event_last(
    before: list[JobEvent], end: JobFinished, after: list[JobEvent]
) -> None:
    history = [*before, end, *after]
    frames = list(shown(JOB_ID, enumerate(history)))
    names = [document["event"] for _, document, _ in frames]
    assert sum(name in TERMINAL_NAMES for name in names) == 1
    assert names[-1] in TERMINAL_NAMES and frames[-1][2]
    assert [terminal for _, _, terminal in frames].count(True) == 1


@given(st.lists(any_event().filter(lambda event: not isinstance(event, JobFinished)), max_size=30))
def test_an_unfinished_history_shows_no_terminal_event(history: list[JobEvent]) -> None:
    frames = list(shown(JOB_ID, enumerate(history)))
    assert not any(document["event"] in TERMINAL_NAMES or terminal for _, document, terminal in frames)
    ids = [entry_id for entry_id, _, _ in frames]
    assert ids == sorted(ids) and len(ids) == len(set(ids))  # in order, once
