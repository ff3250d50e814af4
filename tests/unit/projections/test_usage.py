"""What a job's events add to its key's usage (SPEC S4.5): a pure function, the same however the events are cut."""

from __future__ import annotations

from attrs import evolve
from hypothesis import given
from hypothesis import strategies as st

from broker.events import (
    JobCreated,
    JobFinished,
    JobStatus,
    RunAccepted,
    RunInterrupted,
    RunResubmitted,
    Scheduling,
    StopRequested,
)
from projections.job import fold
from projections.usage import Used, facts, needs_history, run_ms
from tests.strategies import BASE_MS, JOB_ID, histories

CREATED = JobCreated(
    job_id=JOB_ID, at_ms=BASE_MS, body="{}", fingerprint="f", scheduling=Scheduling(fairness_key="team-a")
)
USAGE = '{"input_tokens": 30, "output_tokens": 12, "total_tokens": 42}'


def accepted(attempt: int, at: int) -> RunAccepted:
    return RunAccepted(job_id=JOB_ID, at_ms=BASE_MS + at, attempt=attempt, hermes_run_id=f"run_{attempt}")


def test_a_completed_run_counts_a_start_its_slot_time_and_its_tokens() -> None:
    events = [
        CREATED,
        accepted(1, 1_000),
        JobFinished(job_id=JOB_ID, at_ms=BASE_MS + 6_500, status=JobStatus.COMPLETED, attempt=1, usage=USAGE),
    ]
    assert facts(None, events) == [
        Used(marker=f"{JOB_ID}:1:a", key="team-a", at_ms=BASE_MS + 1_000, runs_started=1),
        Used(
            marker=f"{JOB_ID}:end",
            key="team-a",
            at_ms=BASE_MS + 6_500,
            runs_completed=1,
            hermes_ms=5_500,
            input_tokens=30,
            output_tokens=12,
            total_tokens=42,
        ),
    ]


def test_an_interrupted_run_counts_its_slot_time_and_the_resubmitted_run_its_own() -> None:
    events = [
        CREATED,
        accepted(1, 1_000),
        RunInterrupted(job_id=JOB_ID, at_ms=BASE_MS + 3_000, attempt=1, hermes_run_id="run_1", reason="not_found"),
        RunResubmitted(job_id=JOB_ID, at_ms=BASE_MS + 3_000, attempt=2),
        accepted(2, 4_000),
        StopRequested(job_id=JOB_ID, at_ms=BASE_MS + 4_500),
        JobFinished(job_id=JOB_ID, at_ms=BASE_MS + 5_000, status=JobStatus.CANCELLED, attempt=2, usage=USAGE),
    ]
    found = facts(None, events)
    assert [(used.marker.removeprefix(JOB_ID), used.runs_started, used.hermes_ms) for used in found] == [
        (":1:a", 1, 0),
        (":1:i", 0, 2_000),
        (":2:a", 1, 0),
        (":end", 0, 1_000),
    ]
    assert found[-1].runs_cancelled == 1 and found[-1].total_tokens == 0  # tokens count for completed runs only
    assert [used.settles for used in found] == [False, True, False, True]


def test_a_job_that_never_ran_uses_nothing() -> None:
    stop = StopRequested(job_id=JOB_ID, at_ms=BASE_MS + 10)
    end = JobFinished(job_id=JOB_ID, at_ms=BASE_MS + 10, status=JobStatus.CANCELLED, error_code="stopped")
    assert facts(None, [CREATED, stop, end]) == []


def test_a_job_that_fails_after_its_last_run_was_interrupted_counts_no_second_slot_time() -> None:
    events = [
        CREATED,
        accepted(1, 1_000),
        RunInterrupted(job_id=JOB_ID, at_ms=BASE_MS + 2_000, attempt=1, hermes_run_id="run_1", reason="interrupted"),
        JobFinished(job_id=JOB_ID, at_ms=BASE_MS + 9_000, status=JobStatus.FAILED, error_code="resubmit_exhausted"),
    ]
    found = facts(None, events)
    assert sum(used.hermes_ms for used in found) == 1_000
    assert found[-1].runs_failed == 1 and found[-1].hermes_ms == 0


def test_usage_in_garbled_or_partial_shapes_counts_what_is_readable() -> None:
    for usage, total in (("not json", 0), ('{"total_tokens": 5}', 5), ('{"total_tokens": true}', 0), ("[1]", 0)):
        end = JobFinished(job_id=JOB_ID, at_ms=BASE_MS + 2, status=JobStatus.COMPLETED, usage=usage)
        assert facts(None, [CREATED, accepted(1, 1), end])[-1].total_tokens == total


def test_a_view_stored_without_the_acceptance_time_asks_for_the_history() -> None:
    view = fold([CREATED, accepted(1, 1_000)])
    assert view is not None and view.live_since_ms == BASE_MS + 1_000
    older = evolve(view, live_since_ms=None)  # as a broker before usage stored it
    end = JobFinished(job_id=JOB_ID, at_ms=BASE_MS + 2_000, status=JobStatus.COMPLETED)
    assert needs_history(older, [end]) and not needs_history(view, [end])
    assert run_ms(view, BASE_MS + 2_000) == 1_000 and run_ms(older, BASE_MS + 2_000) == 0
    assert fold([end], older) is not None


@given(histories(), st.data())
def test_the_facts_are_the_same_however_the_history_is_cut(events: list, data: st.DataObject) -> None:  # type: ignore[type-arg]
    cut = data.draw(st.integers(min_value=0, max_value=len(events)))
    whole = facts(None, events)
    assert facts(None, events[:cut]) + facts(fold(events[:cut]), events[cut:]) == whole
    assert sum(used.marker.endswith(":end") for used in whole) <= 1  # a job ends once
    assert all(used.hermes_ms >= 0 for used in whole)


@given(histories())
def test_the_facts_of_a_write_are_those_of_its_events_one_by_one(events: list) -> None:  # type: ignore[type-arg]
    one_by_one = [used for index, event in enumerate(events) for used in facts(fold(events[:index]), [event])]
    assert facts(None, events) == one_by_one
