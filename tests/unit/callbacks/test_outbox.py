"""What a job write owes a callback URL, and the retry pauses (SPEC S5.8). Pure."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from broker.callbacks.outbox import FIRST_RETRY_MS, MAX_RETRY_MS, owed, retry_in_ms
from broker.callbacks.sender import _retry_after_ms
from broker.codec import decode, encode, encode_view
from broker.events import (
    HermesEventRecorded,
    JobCreated,
    JobEvent,
    JobFinished,
    JobStatus,
    RunAccepted,
    StopRequested,
)
from projections.job import JobView, apply, fold

JOB = "job_" + "c" * 32


def _render(view: JobView) -> dict[str, Any]:
    return {"run_id": view.job_id, "status": view.status.value}


def _created() -> JobView:
    view = apply(None, JobCreated(job_id=JOB, at_ms=1, body="{}", fingerprint="f", callback_url="https://h/"))
    assert view is not None
    return view


def _approval(at_ms: int) -> HermesEventRecorded:
    return HermesEventRecorded(
        job_id=JOB, at_ms=at_ms, attempt=1, hermes_run_id="run_1", name="approval.request", payload='{"command":"rm"}'
    )


def _accepted() -> RunAccepted:
    return RunAccepted(job_id=JOB, at_ms=2, attempt=1, hermes_run_id="run_1")


def test_an_approval_request_and_a_completion_owe_one_delivery_each_in_order() -> None:
    events: list[JobEvent] = [
        _accepted(),
        _approval(3),
        JobFinished(job_id=JOB, at_ms=9, status=JobStatus.COMPLETED, output="ok"),
    ]
    deliveries = owed(_created(), events, _render)
    assert [d.webhook_id for d in deliveries] == [f"{JOB}:job.approval_requested:1", f"{JOB}:job.completed:1"]
    first, last = (orjson.loads(d.body) for d in deliveries)
    assert first == {
        "type": "job.approval_requested",
        "created_at": 3,
        "data": {"run_id": JOB, "status": "waiting_for_approval"},
    }
    assert last == {"type": "job.completed", "created_at": 9, "data": {"run_id": JOB, "status": "completed"}}


@pytest.mark.parametrize(("status", "kind"), [(JobStatus.FAILED, "job.failed"), (JobStatus.CANCELLED, "job.cancelled")])
def test_each_terminal_state_owes_its_type(status: JobStatus, kind: str) -> None:
    [delivery] = owed(_created(), [JobFinished(job_id=JOB, at_ms=5, status=status)], _render)
    assert orjson.loads(delivery.body)["type"] == kind and delivery.webhook_id == f"{JOB}:{kind}:1"


def test_activity_a_stop_request_and_events_after_the_end_owe_nothing() -> None:
    live = fold([_accepted()], _created())
    assert live is not None
    assert owed(live, [StopRequested(job_id=JOB, at_ms=3)], _render) == []
    ended = fold([JobFinished(job_id=JOB, at_ms=4, status=JobStatus.FAILED)], live)
    assert ended is not None
    assert owed(ended, [JobFinished(job_id=JOB, at_ms=5, status=JobStatus.COMPLETED), _approval(6)], _render) == []


def test_retries_start_within_five_seconds_and_double_up_to_ten_minutes() -> None:
    assert FIRST_RETRY_MS // 2 <= retry_in_ms(1, 0.0) <= retry_in_ms(1, 1.0) == FIRST_RETRY_MS
    assert retry_in_ms(2, 1.0) == 2 * FIRST_RETRY_MS
    assert retry_in_ms(50, 1.0) == MAX_RETRY_MS and retry_in_ms(50, 0.0) == MAX_RETRY_MS // 2


def test_retry_after_is_honoured() -> None:
    assert retry_in_ms(1, 0.0, retry_after_ms=30_000) == 30_000
    assert retry_in_ms(1, 1.0, retry_after_ms=1_000) == FIRST_RETRY_MS


def test_a_job_stored_before_callbacks_reads_as_having_none() -> None:
    # a JobCreated as brokers before callbacks stored it
    stored = b'{"type":"JobCreated","job_id":"job_x","at_ms":1,"body":"{}","fingerprint":"f"}'
    event = decode(stored)
    assert isinstance(event, JobCreated) and event.callback_url is None
    view = apply(None, event)
    assert view is not None and view.callback_url is None
    assert owed(view, [JobFinished(job_id="job_x", at_ms=2, status=JobStatus.COMPLETED)], _render) == []
    # and a job created without one is stored exactly as before: an older replica reads the same bytes
    assert b"callback" not in encode(event) + encode_view(view)


def test_retry_after_reads_seconds_or_an_http_date() -> None:
    now_ms = 1_796_005_750_000
    assert _retry_after_ms("120", now_ms) == 120_000
    assert _retry_after_ms("Thu, 01 Dec 2026 10:00:00 GMT", 1_796_119_200_000 - 30_000) == 30_000
    assert _retry_after_ms("soon", now_ms) is None and _retry_after_ms(None, now_ms) is None


@pytest.mark.parametrize("value", ["\u00b2", "9" * 5_000, "1\u00b9"])
def test_a_retry_after_of_odd_digits_is_read_without_raising(value: str) -> None:
    # unicode digits are not seconds; a number past any retry window reads as one
    found = _retry_after_ms(value, 0)
    assert found is None or found >= 86_400_000
