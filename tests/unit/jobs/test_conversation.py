"""The pure rules of a conversation's turns (SPEC S4.3): which jobs are ordered, which wait for their session, what
a waiting turn shows, and that RUNS_HOLD does not count the wait for a session."""

from __future__ import annotations

from attrs import evolve

from broker.driver import decide
from broker.driver.decide import Append, Queue, Submit
from broker.events import HoldReason, JobCreated, JobFinished, JobStatus, RunAccepted, Scheduling
from broker.hermes.models import Busy
from broker.jobs import rules
from broker.jobs.conversation import ordered, recheck_at, session_hold, waits
from broker.jobs.policy import Policy
from broker.store.sessions import Turn
from projections.job import JobView, apply, fold

POLICY = Policy(hold_ms=60_000)


def turn(multitask: str = "enqueue", session: str | None = "s-1") -> JobView:
    created = JobCreated(
        job_id="job_1",
        at_ms=1_000,
        body="{}",
        fingerprint="f",
        session_id=session,
        scheduling=Scheduling(multitask=multitask),
    )
    view = apply(None, created)
    assert view is not None
    return view


def test_a_turn_is_ordered_unless_parallel_or_without_a_session() -> None:
    assert ordered(turn("enqueue")) and ordered(turn("reject")) and ordered(turn("interrupt"))
    assert not ordered(turn("parallel"))
    assert not ordered(turn("enqueue", session=None))


def test_a_stored_job_without_multitask_reads_as_parallel() -> None:
    assert Scheduling().multitask == "parallel"


def test_a_turn_waits_for_its_session_until_its_run_is_live_or_it_ends_or_is_stopped() -> None:
    view = turn()
    assert waits(view)
    live = fold([RunAccepted(job_id="job_1", at_ms=2_000, attempt=1, hermes_run_id="run_1")], view)
    assert live is not None and not waits(live)
    assert not waits(evolve(view, stop_requested=True))
    assert not waits(evolve(view, status=JobStatus.COMPLETED))
    assert not waits(turn("parallel"))


def test_a_waiting_turn_shows_a_session_hold_naming_the_holder_and_the_session() -> None:
    hold = session_hold(turn(), "job_0", 5_000)
    assert hold.reason is HoldReason.SESSION
    assert hold.detail == "Waiting for job_0 of session s-1."
    assert hold.since_ms == 1_000 and hold.retry_at_ms == 5_000


def test_the_turn_right_behind_the_holder_looks_again_sooner_than_those_further_back() -> None:
    assert recheck_at(Turn(False, holder="h", ahead=1), 0) < recheck_at(Turn(False, holder="h", ahead=3), 0)


def test_a_superseded_turn_ends_cancelled_with_superseded_naming_the_later_turn() -> None:
    events = rules.on_stop_request(turn(), 2_000, superseded_by="job_9")
    view = fold(events, turn())
    assert view is not None and view.status is JobStatus.CANCELLED
    assert view.error_code == "superseded" and view.error_message is not None and "job_9" in view.error_message
    finished = events[-1]
    assert isinstance(finished, JobFinished)


def test_a_callers_stop_still_ends_stopped() -> None:
    view = fold(rules.on_stop_request(turn(), 2_000), turn())
    assert view is not None and view.error_code == "stopped"


def test_the_wait_for_a_session_does_not_count_toward_runs_hold() -> None:
    # Given a turn created at 1 s that got its session only at 100 s, past RUNS_HOLD (60 s) from its create
    view, now, since = turn(), 101_000, 100_000
    # Then it is submitted, not expired; without its turn's start it would have expired
    assert isinstance(decide.next_action(view, now, stop_sent=False, admitted=True, policy=POLICY), Append)
    action = decide.next_action(view, now, stop_sent=False, admitted=True, policy=POLICY, turn_since_ms=since)
    assert isinstance(action, Submit)
    queued = decide.next_action(view, now, stop_sent=False, admitted=False, policy=POLICY, turn_since_ms=since)
    assert isinstance(queued, Queue) and queued.deadline_ms == since + POLICY.hold_ms
    # And a refusal then holds it from its turn's start, not from its create
    busy = Busy(retry_after_s=1.0, message="busy")
    held = decide.on_create(view, 1, busy, now, retry_at_ms=now + 1_000, policy=POLICY, turn_since_ms=since)
    assert len(held) == 1 and getattr(held[0], "since_ms", None) == since
