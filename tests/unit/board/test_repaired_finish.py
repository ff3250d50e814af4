"""A finish learnt later by repair (SPEC S5.6) keeps the known source time; it never invents one."""

from __future__ import annotations

from broker.board.report import render
from broker.codec import decode, encode
from broker.events import JobFinished, JobStatus, RunAccepted
from projections.board import EntryState, fold
from tests.strategies_board import BASE_MS, JOB_ID, created


def test_a_repaired_finish_keeps_the_known_source_time() -> None:
    accepted = RunAccepted(job_id=JOB_ID, at_ms=BASE_MS + 50, attempt=1, hermes_run_id="run_1")
    repaired = JobFinished(
        job_id=JOB_ID, at_ms=BASE_MS + 3_600_000, status=JobStatus.COMPLETED, attempt=1, source_at_ms=BASE_MS + 50
    )
    version = fold([created(), accepted, repaired]).version
    assert version is not None
    assert version.state is EntryState.DONE and version.state_change
    assert version.at_ms == BASE_MS + 3_600_000  # the version is new ...
    assert version.source_activity_at_ms == BASE_MS + 50  # ... its activity is not


def test_a_driver_finish_is_its_own_activity() -> None:
    finished = JobFinished(job_id=JOB_ID, at_ms=BASE_MS + 900, status=JobStatus.FAILED, error_message="boom")
    version = fold([created(), finished]).version
    assert version is not None and version.source_activity_at_ms == BASE_MS + 900


def test_the_source_time_round_trips_and_rebuilds_the_same_bytes() -> None:
    repaired = JobFinished(job_id=JOB_ID, at_ms=BASE_MS + 10, status=JobStatus.COMPLETED, source_at_ms=BASE_MS)
    assert decode(encode(repaired)) == repaired
    first, again = fold([created(), repaired]).version, fold([created(), decode(encode(repaired))]).version
    assert first is not None and again is not None and render(first, "runs") == render(again, "runs")


def test_an_old_finish_without_the_field_still_decodes() -> None:
    stored = b'{"type":"JobFinished","job_id":"j","at_ms":5,"status":"completed"}'
    event = decode(stored)
    assert isinstance(event, JobFinished) and event.source_at_ms is None
