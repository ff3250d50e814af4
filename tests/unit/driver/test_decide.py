"""The driving rules as a state machine: whatever Hermes answers, the invariants of SPEC S4 hold."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from broker.admission import fair
from broker.admission.state import line_place
from broker.driver import decide
from broker.driver.decide import Append, Done, Follow, Queue, StopRun, Submit
from broker.events import HoldReason, JobCreated, JobEvent, JobStatus, RunAccepted, StopRequested
from broker.hermes.models import (
    Accepted,
    Busy,
    CreateOutcome,
    Draining,
    HermesEvent,
    HermesRun,
    NotFound,
    Rejected,
    StopOutcome,
    Stopping,
    Unauthorized,
    Unavailable,
)
from broker.jobs.policy import Policy
from projections.job import JobView, apply, fold

POLICY = Policy(hold_ms=10_000, resubmit=2, backoff_ms=100, backoff_max_ms=1_000, events_maxlen=40)
JOB = "job_" + "0" * 32

refusals = st.one_of(
    st.builds(Busy, st.none() | st.floats(0, 5)),
    st.builds(Draining, st.just(1.0)),
    st.builds(Unavailable, st.just("Hermes refused the connection.")),
    st.builds(Unauthorized, st.sampled_from([401, 403])),
)
#: Every kind of answer Hermes (0.19.0 or upstream main) gives to POST /v1/runs/{id}/stop.
stop_answers = st.sampled_from(
    [
        Stopping("run_x", "stopping"),
        Stopping("run_x", "cancelled"),
        Stopping("run_x", "interrupted"),
        Stopping("run_x", "completed"),
        NotFound("run_x"),
        Rejected(409, "Run is not active", "run_not_active"),
        Rejected(404, "gone", None),
        Rejected(400, "odd", None),
        Unavailable("Hermes refused the connection."),
        Unauthorized(401),
    ]
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
        self.admitted = False  #: the driver holds an admission slot for the job
        self.stop_retries = 0

    def append(self, events: list[JobEvent]) -> None:
        for event in events:
            new = apply(self.view, event)
            assert new is not None
            self.view = new
            self.events.append(event)
            if isinstance(event, RunAccepted):
                self.accepted_runs += 1

    def action(self) -> decide.Action:
        stop_sent = self.stop_sent == self.view.attempt
        return decide.next_action(self.view, self.now, stop_sent=stop_sent, admitted=self.admitted, policy=POLICY)

    @rule(ms=st.integers(1, 3_000))
    def time_passes(self, ms: int) -> None:
        self.now += ms

    @precondition(lambda self: isinstance(self.action(), Queue))
    @rule()
    def the_line_grants_a_slot(self) -> None:
        action = self.action()
        assert isinstance(action, Queue) and action.deadline_ms > self.now
        assert action.place == line_place(self.view)
        self.admitted = True

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
        if decide.refusal_of(outcome) is not None:
            self.admitted = False  # back in the line
        events = decide.on_create(
            self.view, action.attempt, outcome, self.now, retry_at_ms=self.now + 500, policy=POLICY
        )
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
    @rule(answer=stop_answers)
    def hermes_answers_a_stop(self, answer: StopOutcome) -> None:
        verdict = decide.on_stop(self.view, answer, self.now)
        assert [verdict.retry, verdict.sent, bool(verdict.events)].count(True) == 1, "one meaning per answer"
        if verdict.retry:
            self.stop_retries += 1
            self.now += decide.backoff_ms(self.stop_retries, 0.5, POLICY)  # never asked again at once
            return
        if verdict.sent:
            self.stop_sent = self.view.attempt
        self.append(list(verdict.events))
        if self.view.status.terminal:
            assert self.view.status is JobStatus.CANCELLED and self.view.error_code in ("stopped", "approval_denied")
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
    def hermes_is_only_asked_to_create_with_a_slot(self) -> None:
        if isinstance(self.action(), Submit):
            assert self.admitted

    @invariant()
    def a_held_job_has_not_been_accepted(self) -> None:
        if self.view.hold is not None:
            assert self.view.accepted_attempt != self.view.attempt


TestDriving = Driving.TestCase
TestDriving.settings = settings(max_examples=400, stateful_step_count=60, deadline=None)


def test_backoff_grows_with_failures_up_to_its_cap_and_is_jittered() -> None:
    assert [decide.backoff_ms(n, 0.0, POLICY) for n in (1, 2, 3, 4, 5, 30)] == [50, 100, 200, 400, 500, 500]
    assert [decide.backoff_ms(n, 0.99, POLICY) for n in (1, 5)] == [99, 995]


def _stopping_view() -> JobView:
    created = JobCreated(job_id=JOB, at_ms=1, body="{}", fingerprint="f")
    view = fold([created, RunAccepted(job_id=JOB, at_ms=2, attempt=1, hermes_run_id="run_1"),
                 StopRequested(job_id=JOB, at_ms=3)])  # fmt: skip
    assert view is not None and view.status is JobStatus.STOPPING
    return view


@given(answers=st.lists(stop_answers, min_size=1, max_size=30))
def test_every_stop_answer_ends_the_job_follows_the_run_or_backs_off(answers: list[StopOutcome]) -> None:
    # Given a stopping job, When Hermes answers the stops in any order, Then each answer ends the job
    # (the run is gone or settled), hands over to following the run (it will settle), or waits a
    # growing backoff before asking again: never an unbounded loop of immediate stops.
    view, failures, waited = _stopping_view(), 0, []
    for answer in answers:
        verdict = decide.on_stop(view, answer, 10)
        if not verdict.retry:
            after = fold(verdict.events, view)
            assert after is not None
            assert verdict.sent or (after.status is JobStatus.CANCELLED and after.error_code == "stopped")
            return
        failures += 1
        waited.append(decide.backoff_ms(failures, 0.0, POLICY))
    assert waited == sorted(waited) and waited[0] >= POLICY.backoff_ms // 2


def test_a_stop_of_a_run_hermes_no_longer_holds_cancels_at_once() -> None:
    for gone in (
        NotFound("run_1"),
        Rejected(409, "Run is not active", "run_not_active"),
        Stopping("run_1", "interrupted"),
    ):
        [finished] = decide.on_stop(_stopping_view(), gone, 4).events
        after = apply(_stopping_view(), finished)
        assert after is not None and after.status is JobStatus.CANCELLED and after.error_code == "stopped"


def test_a_waiting_job_queues_until_granted_and_expires_after_the_hold() -> None:
    view = apply(None, JobCreated(job_id=JOB, at_ms=1_000, body="{}", fingerprint="f"))
    assert view is not None
    assert decide.next_action(view, 2_000, stop_sent=False, admitted=False, policy=POLICY) == Queue(
        str(fair.front(3)), 11_000
    )
    assert isinstance(decide.next_action(view, 2_000, stop_sent=False, admitted=True, policy=POLICY), Submit)
    expired = decide.next_action(view, 11_000, stop_sent=False, admitted=True, policy=POLICY)
    assert isinstance(expired, Append)
    after = fold(expired.events, view)
    assert after is not None and after.error_code == "hold_expired"


def test_a_refused_create_holds_with_the_line_retry_at_and_hermes_words() -> None:
    view = apply(None, JobCreated(job_id=JOB, at_ms=1_000, body="{}", fingerprint="f"))
    assert view is not None
    [held] = decide.on_create(view, 1, Unauthorized(403, "X-Hermes-Session-Key requires API key authentication"),
                              3_000, retry_at_ms=4_000, policy=POLICY)  # fmt: skip
    after = apply(view, held)
    assert after is not None and after.hold is not None
    assert (after.hold.reason, after.hold.since_ms, after.hold.retry_at_ms) == (HoldReason.UNAVAILABLE, 1_000, 4_000)
    assert after.hold.detail == "X-Hermes-Session-Key requires API key authentication"


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
    [event] = decide.on_create(view, 1, Rejected(400, "Missing 'input' field", None), 2, retry_at_ms=2, policy=POLICY)
    after = apply(view, event)
    assert (
        after is not None and after.error_code == "hermes_rejected" and after.error_message == "Missing 'input' field"
    )


@given(deltas=st.integers(0, 12), cap=st.integers(0, 6))
def test_the_terminal_event_is_the_job_s_last_even_when_deltas_were_dropped_with_it(deltas: int, cap: int) -> None:
    # Given a running job whose store takes `cap` events, When one batch brings deltas past it and the end
    created = JobCreated(job_id=JOB, at_ms=1, body="{}", fingerprint="f")
    view = fold([created, RunAccepted(job_id=JOB, at_ms=2, attempt=1, hermes_run_id="run_1")])
    assert view is not None
    items = [HermesEvent("message.delta", {"event": "message.delta", "delta": "x"}) for _ in range(deltas)]
    items.append(HermesEvent("run.completed", {"event": "run.completed", "output": "done"}))
    policy = Policy(hold_ms=10_000, resubmit=2, backoff_ms=100, backoff_max_ms=1_000, events_maxlen=cap)
    events = decide.on_events(view, 1, "run_1", items, 10, policy)
    # Then the job ends with its terminal event, the drop counted before it
    after = fold(events, view)
    assert after is not None and after.status is JobStatus.COMPLETED
    assert type(events[-1]).__name__ == "JobFinished"
    dropped = sum(getattr(event, "count", 0) for event in events if type(event).__name__ == "DeltasDropped")
    assert dropped == max(0, deltas - max(0, cap - view.event_count))


def test_a_deny_names_the_command_asked_for_earlier_in_the_same_batch() -> None:
    # Given a running job, When one batch brings an approval request and its denial
    created = JobCreated(job_id=JOB, at_ms=1, body="{}", fingerprint="f")
    view = fold([created, RunAccepted(job_id=JOB, at_ms=2, attempt=1, hermes_run_id="run_1")])
    assert view is not None
    items = [
        HermesEvent("approval.request", {"event": "approval.request", "command": "rm -rf /tmp/x"}),
        HermesEvent("message.delta", {"event": "message.delta", "delta": "x"}),
        HermesEvent("approval.responded", {"event": "approval.responded", "choice": "deny"}),
    ]
    events = decide.on_events(view, 1, "run_1", items, 10, POLICY)
    # Then the denial names that command, and the job stops
    assert [type(event).__name__ for event in events][-1] == "ApprovalDenied"
    assert getattr(events[-1], "command", None) == "rm -rf /tmp/x"
    after = fold(events, view)
    assert after is not None and after.status is JobStatus.STOPPING and after.event_count == view.event_count + 4
