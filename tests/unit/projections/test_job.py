"""The job view fold (SPEC S3.2): properties over plausible histories, and the status rules."""

from __future__ import annotations

from attrs import evolve
from hypothesis import assume, given
from hypothesis import strategies as st

from broker.codec import decode, encode
from broker.events import (
    ApprovalDenied,
    HermesEventRecorded,
    HoldReason,
    JobCreated,
    JobEvent,
    JobFinished,
    JobHeld,
    JobStatus,
    RunAccepted,
    RunResubmitted,
    StopRequested,
    UnknownEvent,
)
from broker.http.render import job_object
from projections.job import Hold, JobView, apply, fold
from tests.strategies import BASE_MS, JOB_ID, created, event_lists, hermes_event, histories, later_event

CREATED = JobCreated(job_id=JOB_ID, at_ms=BASE_MS, body='{"input":"hi"}', fingerprint="f" * 64)


def _accepted(attempt: int = 1, run_id: str = "run_a", at: int = BASE_MS + 10) -> RunAccepted:
    return RunAccepted(job_id=JOB_ID, at_ms=at, attempt=attempt, hermes_run_id=run_id)


def _hermes(name: str, attempt: int = 1, run_id: str = "run_a", at: int = BASE_MS + 20) -> HermesEventRecorded:
    return HermesEventRecorded(job_id=JOB_ID, at_ms=at, attempt=attempt, hermes_run_id=run_id, name=name, payload="{}")


def _uncounted(view: JobView | None) -> JobView | None:
    """The view without its stored-event counter (every stored event counts, relevant or not)."""
    return None if view is None else evolve(view, event_count=0)


def _view(*events: JobEvent) -> JobView:
    view = fold([CREATED, *events])
    assert view is not None
    return view


# -- properties ---------------------------------------------------------------------------------


@given(histories(), st.data())
def test_fold_is_resumable_at_any_split(events: list[JobEvent], data: st.DataObject) -> None:
    split = data.draw(st.integers(min_value=0, max_value=len(events)))
    assert fold(events[split:], fold(events[:split])) == fold(events)


@given(st.one_of(histories(), event_lists()), st.data())
def test_fold_is_apply_event_by_event(events: list[JobEvent], data: st.DataObject) -> None:
    initial = data.draw(st.sampled_from([None, fold(events[:1])]))
    stepped = initial
    for event in events:
        stepped = apply(stepped, event)
    assert fold(events, initial) == stepped  # the counter too: one per event folded onto a live view


@given(event_lists())
def test_fold_is_deterministic(events: list[JobEvent]) -> None:
    assert fold(events) == fold(list(events))


@given(histories(), st.lists(later_event(), max_size=10))
def test_a_terminal_view_absorbs_every_later_event(events: list[JobEvent], more: list[JobEvent]) -> None:
    view = fold(events)
    assume(view is not None and view.status.terminal)
    assert fold(more, view) == view


@given(histories(), st.sampled_from([JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED]))
def test_job_finished_always_ends_the_job(events: list[JobEvent], status: JobStatus) -> None:
    view = fold(events)
    assert view is not None
    finished = fold([JobFinished(job_id=JOB_ID, at_ms=BASE_MS, status=status)], view)
    assert finished is not None
    assert finished.status.terminal
    if not view.status.terminal:
        assert finished.status == status
        assert finished.hold is None


@given(histories())
def test_attempts_never_exceed_the_accepted_runs(events: list[JobEvent]) -> None:
    view = fold(events)
    assert view is not None
    assert 0 <= view.attempts <= sum(isinstance(event, RunAccepted) for event in events)


@given(event_lists())
def test_nothing_exists_before_job_created(events: list[JobEvent]) -> None:
    before = [event for event in events if not isinstance(event, JobCreated)]
    assert fold(before) is None


@given(st.lists(later_event().filter(lambda e: not isinstance(e, JobCreated)), max_size=10), histories())
def test_events_before_the_create_are_ignored(orphans: list[JobEvent], events: list[JobEvent]) -> None:
    assert fold([*orphans, *events]) == fold(events)


@given(histories(), hermes_event())
def test_a_late_hermes_event_of_another_attempt_changes_nothing(
    events: list[JobEvent], late: HermesEventRecorded
) -> None:
    view = fold(events)
    assert view is not None
    assume(late.attempt != view.attempt or late.hermes_run_id != view.hermes_run_id)
    assert _uncounted(apply(view, late)) == _uncounted(view)


@given(histories())
def test_the_view_keeps_the_creates_identity(events: list[JobEvent]) -> None:
    first = events[0]
    assert isinstance(first, JobCreated)
    view = fold(events)
    assert view is not None
    assert (view.job_id, view.fingerprint, view.context, view.reporting, view.created_at_ms) == (
        first.job_id,
        first.fingerprint,
        first.context,
        first.reporting,
        first.at_ms,
    )


@given(created())
def test_a_replayed_create_changes_nothing(event: JobCreated) -> None:
    view = _view()
    assert _uncounted(apply(view, event)) == _uncounted(view)
    assert _uncounted(apply(view, UnknownEvent())) == _uncounted(view)


# -- the status rules of S3.2 ---------------------------------------------------------------------


def test_a_new_job_is_queued_with_nothing_else() -> None:
    view = _view()
    assert view.status == JobStatus.QUEUED
    assert (view.attempts, view.hermes_run_id, view.hold, view.output, view.error_code) == (0, None, None, None, None)
    assert view.last_event == "job.queued"
    assert view.created_at_ms == view.updated_at_ms == BASE_MS


def test_a_hold_keeps_its_first_since_and_clears_on_accept() -> None:
    first = JobHeld(job_id=JOB_ID, at_ms=BASE_MS + 1, reason=HoldReason.BUSY, retry_at_ms=BASE_MS + 5)
    second = JobHeld(job_id=JOB_ID, at_ms=BASE_MS + 6, reason=HoldReason.UNAVAILABLE, retry_at_ms=BASE_MS + 9)
    held = _view(first, second)
    assert held.status == JobStatus.QUEUED
    assert held.hold == Hold(HoldReason.UNAVAILABLE, BASE_MS + 1, BASE_MS + 9)
    assert held.attempts == 0
    accepted = fold([_accepted()], held)
    assert accepted is not None
    assert (accepted.status, accepted.hold, accepted.attempts, accepted.hermes_run_id) == (
        JobStatus.RUNNING,
        None,
        1,
        "run_a",
    )


def test_an_approval_request_waits_and_the_response_resumes() -> None:
    waiting = _view(_accepted(), _hermes("approval.request"))
    assert waiting.status == JobStatus.WAITING_FOR_APPROVAL
    assert waiting.last_event == "approval.request"
    assert _uncounted(fold([_hermes("approval.responded")], waiting)) == _uncounted(
        evolve(waiting, status=JobStatus.RUNNING, last_event="approval.responded")
    )


def test_deltas_move_neither_last_event_nor_updated_at() -> None:
    running = _view(_accepted(), _hermes("tool.started"))
    assert _uncounted(apply(running, _hermes("message.delta", at=BASE_MS + 99))) == _uncounted(running)


def test_a_resubmit_keeps_the_job_running_and_ignores_the_old_runs_events() -> None:
    resubmitted = _view(_accepted(), RunResubmitted(job_id=JOB_ID, at_ms=BASE_MS + 30, attempt=2))
    assert (resubmitted.status, resubmitted.attempt, resubmitted.attempts) == (JobStatus.RUNNING, 2, 1)
    assert _uncounted(apply(resubmitted, _hermes("tool.started", attempt=1))) == _uncounted(resubmitted)
    second = fold([_accepted(2, "run_b"), _hermes("tool.started", 2, "run_b")], resubmitted)
    assert second is not None
    assert (second.attempts, second.hermes_run_id, second.last_event) == (2, "run_b", "tool.started")


def test_a_stop_of_a_running_job_is_stopping_and_survives_a_late_accept() -> None:
    stopping = _view(_accepted(), StopRequested(job_id=JOB_ID, at_ms=BASE_MS + 40))
    assert stopping.status == JobStatus.STOPPING
    assert apply(stopping, _hermes("approval.request")).status == JobStatus.STOPPING  # type: ignore[union-attr]
    queued_stop = _view(StopRequested(job_id=JOB_ID, at_ms=BASE_MS + 5))
    assert fold([_accepted()], queued_stop).status == JobStatus.STOPPING  # type: ignore[union-attr]


def test_a_denied_approval_records_the_command() -> None:
    denied = _view(_accepted(), ApprovalDenied(job_id=JOB_ID, at_ms=BASE_MS + 50, attempt=1, command="rm -rf /"))
    assert (denied.status, denied.denied_command, denied.stop_requested) == (JobStatus.STOPPING, "rm -rf /", True)


def test_finishing_records_output_usage_and_error() -> None:
    done = _view(
        _accepted(),
        JobFinished(job_id=JOB_ID, at_ms=BASE_MS + 60, status=JobStatus.COMPLETED, attempt=1, output="ok", usage="{}"),
    )
    assert (done.status, done.output, done.usage, done.last_event, done.updated_at_ms) == (
        JobStatus.COMPLETED,
        "ok",
        "{}",
        "run.completed",
        BASE_MS + 60,
    )
    failed = _view(
        JobFinished(job_id=JOB_ID, at_ms=BASE_MS + 9, status=JobStatus.FAILED, error_code="hold_expired"),
        _accepted(),
    )
    assert (failed.status, failed.error_code, failed.attempts) == (JobStatus.FAILED, "hold_expired", 0)


@given(histories())
def test_every_event_after_the_create_is_counted_until_the_job_ends(events: list[JobEvent]) -> None:
    view = fold(events)
    assert view is not None
    assert view.event_count <= len(events) - 1
    if not view.status.terminal:
        assert view.event_count == len(events) - 1


@given(histories())
def test_the_upstream_is_that_of_an_accepted_run_and_none_before_one(events: list[JobEvent]) -> None:
    view = fold(events)
    assume(view is not None)
    assert view is not None
    if view.attempts == 0:
        assert view.upstream is None
    else:
        assert view.upstream in {e.upstream for e in events if isinstance(e, RunAccepted)}


def test_the_job_object_names_the_upstream_of_the_run_and_the_first_for_a_run_accepted_before_s10() -> None:
    queued = _view()
    assert job_object(queued, "hermes-1:8642")["upstream"] is None  # null before an acceptance
    old = _view(_accepted())  # a job.accepted a broker before S10 wrote: it names no upstream
    assert old.upstream is None and job_object(old, "hermes-1:8642")["upstream"] == "hermes-1:8642"
    moved = _view(_accepted(), evolve(_accepted(2, "run_b"), upstream="hermes-2:8642"))
    assert moved.upstream == "hermes-2:8642" and job_object(moved, "hermes-1:8642")["upstream"] == "hermes-2:8642"
    assert decode(b'{"type":"RunAccepted","job_id":"j","at_ms":1,"attempt":1,"hermes_run_id":"r"}') == RunAccepted(
        job_id="j", at_ms=1, attempt=1, hermes_run_id="r", upstream=None
    )
    assert b"upstream" not in encode(_accepted())  # an event that names no upstream is stored as before S10
