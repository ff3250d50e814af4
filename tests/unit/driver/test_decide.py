"""The driving rules as a state machine: whatever Hermes answers, the invariants of SPEC S4 hold."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.driver import decide
from broker.driver.decide import Append, Done, Follow, Policy, StopRun, Submit, Wait
from broker.events import JobCreated, JobEvent, JobStatus, RunAccepted, StopRequested
from broker.hermes.models import (
    Accepted,
    Busy,
    CreateOutcome,
    Draining,
    HermesEvent,
    HermesRun,
    NotFound,
    Rejected,
    Unauthorized,
    Unavailable,
)
from projections.job import JobView, apply, fold

POLICY = Policy(hold_ms=10_000, resubmit=2, backoff_ms=100, backoff_max_ms=1_000, events_maxlen=40)
JOB = "job_" + "0" * 32

refusals = st.one_of(
    st.builds(Busy, st.none() | st.floats(0, 5)),
    st.builds(Draining, st.just(1.0)),
    st.builds(Unavailable, st.just("refused")),
    st.builds(Unauthorized, st.sampled_from([401, 403])),
)
live_names = st.sampled_from(
    ["message.delta", "tool.started", "tool.completed", "reasoning.available", "approval.request", "todo.updated"]
)
statuses = st.sampled_from(["running", "waiting_for_approval", "interrupted", "cancelled", "interrupted",
                            "cancelled", "completed", "failed"])  # fmt: skip


def run(run_id: str, status: str) -> HermesRun:
    return HermesRun.from_api({"run_id": run_id, "status": status, "output": "ok", "usage": {"total_tokens": 3}})


class Driving(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        created = JobCreated(job_id=JOB, at_ms=1_000, body='{"input":"x"}', fingerprint="f")
        self.events: list[JobEvent] = [created]
        view = apply(None, created)
        assert view is not None
        self.view: JobView = view
        self.now = 1_000
        self.accepted_runs = 0
        self.live_run: str | None = None
        self.stop_requested_before_end = False
        self.stop_sent = 0

    def append(self, events: list[JobEvent]) -> None:
        for event in events:
            new = apply(self.view, event)
            assert new is not None
            self.view = new
            self.events.append(event)
            if isinstance(event, RunAccepted):
                self.accepted_runs += 1

    def action(self) -> decide.Action:
        return decide.next_action(self.view, self.now, stop_sent=self.stop_sent == self.view.attempt)

    @rule(ms=st.integers(1, 3_000))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    @precondition(lambda self: isinstance(self.action(), Wait))
    @rule()
    def wait_for_retry(self) -> None:
        action = self.action()
        assert isinstance(action, Wait) and action.until_ms > self.now
        self.now = action.until_ms

    @precondition(lambda self: isinstance(self.action(), Append))
    @rule()
    def append_decided(self) -> None:
        action = self.action()
        assert isinstance(action, Append)
        self.append(list(action.events))

    @precondition(lambda self: isinstance(self.action(), Submit))
    @rule(accepted=st.integers(0, 3), refusal=refusals)
    def hermes_answers_a_create(self, accepted: int, refusal: CreateOutcome) -> None:
        # Mostly accepted (so that runs get far), sometimes refused, rarely rejected.
        outcome = Accepted("placeholder") if accepted else refusal
        if isinstance(refusal, Unauthorized) and accepted == 0 and refusal.status == 403:
            outcome = Rejected(400, "bad", None)
        action = self.action()
        assert isinstance(action, Submit)
        # Invariant: never a second live Hermes run for one job.
        assert self.live_run is None, "submitted while a Hermes run is live"
        expected_key = JOB if action.attempt == 1 else f"{JOB}#{action.attempt}"
        assert action.idempotency_key == expected_key
        if isinstance(outcome, Accepted):
            outcome = Accepted(f"run_{action.attempt}")
        events = decide.on_create(self.view, action.attempt, outcome, self.now, 0.5, POLICY)
        self.append(events)
        if isinstance(outcome, Accepted):
            self.live_run = outcome.run_id

    @precondition(lambda self: isinstance(self.action(), Follow))
    @rule(names=st.lists(live_names, min_size=1, max_size=6), deny=st.integers(0, 5))
    def hermes_streams_events(self, names: list[str], deny: int) -> None:
        action = self.action()
        assert isinstance(action, Follow)
        items = [HermesEvent(name, {"event": name, "command": "rm -rf /", "timestamp": 1.0}) for name in names]
        if deny == 0:
            items.append(HermesEvent("approval.responded", {"event": "approval.responded", "choice": "deny"}))
        self.append(decide.on_events(self.view, action.attempt, action.hermes_run_id, items, self.now, POLICY))

    @precondition(lambda self: isinstance(self.action(), Follow | StopRun))
    @rule(status=statuses, lost=st.integers(0, 3))
    def hermes_reports_a_status(self, status: str, lost: int) -> None:
        action = self.action()
        assert isinstance(action, Follow | StopRun)
        run_id = action.hermes_run_id
        attempt = self.view.attempt
        answer: HermesRun | NotFound = NotFound(run_id) if lost == 0 else run(run_id, status)
        self.append(decide.on_status(self.view, attempt, answer, self.now, POLICY))
        if self.view.status.terminal or self.view.attempt != attempt:
            self.live_run = None

    @precondition(lambda self: isinstance(self.action(), StopRun))
    @rule(gone=st.booleans())
    def hermes_answers_a_stop(self, gone: bool) -> None:
        self.stop_sent = self.view.attempt
        self.append(decide.on_stop(self.view, gone, self.now))
        if self.view.status.terminal:
            self.live_run = None

    @rule(chance=st.integers(0, 5))
    def a_caller_stops_the_job(self, chance: int) -> None:
        if chance or self.view.status.terminal or self.view.stop_requested:
            return
        self.stop_requested_before_end = True
        self.append([StopRequested(job_id=JOB, at_ms=self.now)])

    @rule(old=st.integers(0, 3))
    def a_late_answer_of_an_old_attempt_changes_nothing(self, old: int) -> None:
        if old >= self.view.attempt:
            return
        before = self.view
        late = decide.on_status(self.view, old, run(f"run_{old}", "completed"), self.now, POLICY)
        assert late == [] and self.view == before

    @invariant()
    def attempts_are_runs_hermes_accepted(self) -> None:
        assert self.view.attempts == self.accepted_runs

    @invariant()
    def attempts_are_bounded_by_resubmits(self) -> None:
        assert self.view.attempt <= POLICY.resubmit + 1

    @invariant()
    def the_fold_of_what_was_appended_is_the_state(self) -> None:
        assert fold(self.events) == self.view

    @invariant()
    def a_stop_wins(self) -> None:
        if self.view.status.terminal and self.stop_requested_before_end:
            assert self.view.status is JobStatus.CANCELLED

    @invariant()
    def a_terminal_job_has_nothing_left_to_do(self) -> None:
        if self.view.status.terminal:
            assert isinstance(self.action(), Done)

    @invariant()
    def a_held_job_has_not_been_accepted(self) -> None:
        if self.view.hold is not None:
            assert self.view.accepted_attempt != self.view.attempt


TestDriving = Driving.TestCase
TestDriving.settings = settings(max_examples=400, stateful_step_count=60, deadline=None)


def test_backoff_is_never_shorter_than_retry_after_nor_past_the_hold() -> None:
    assert decide.retry_at(0, 0, 0, 7.0, 0.0, POLICY) == 7_000
    assert decide.retry_at(30, 0, 9_500, None, 0.99, POLICY) == 10_000
    assert 500 <= decide.retry_at(10, 0, 0, None, 0.0, POLICY) - 0 <= 1_000


def test_completed_after_a_stop_is_cancelled() -> None:
    created = JobCreated(job_id=JOB, at_ms=1, body="{}", fingerprint="f")
    view = fold([created, RunAccepted(job_id=JOB, at_ms=2, attempt=1, hermes_run_id="run_1"),
                 StopRequested(job_id=JOB, at_ms=3)])  # fmt: skip
    assert view is not None
    [finished] = decide.on_status(view, 1, run("run_1", "completed"), 4, POLICY)
    after = apply(view, finished)
    assert after is not None and after.status is JobStatus.CANCELLED and after.error_code == "stopped"


def test_hermes_400_rejects_the_job() -> None:
    view = apply(None, JobCreated(job_id=JOB, at_ms=1, body="{}", fingerprint="f"))
    assert view is not None
    [event] = decide.on_create(view, 1, Rejected(400, "Missing 'input' field", None), 2, 0.0, POLICY)
    after = apply(view, event)
    assert (
        after is not None and after.error_code == "hermes_rejected" and after.error_message == "Missing 'input' field"
    )
