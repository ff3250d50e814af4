"""The lost-answer binding (SPEC S10 "A lost upstream takes no new work": a first attempt whose
create answer was lost stays bound to its upstream, its run may be live there, until that upstream answers for it
or is lost).

The binding (`JobView.unanswered_on`) is overwritten by every later `job.held`, so any refusal of the replay that
says nothing about the lost create ends it: a 503 `gateway_draining` (Hermes checks draining before anything else,
and upstream main answers an idempotent replay only after it), a 401/403 while keys rotate (auth comes first), a
5xx with Hermes's envelope, or a refused connection. The job is then routed to another upstream with the same
Idempotency-Key while its first run may be live on the first one: two runs of one attempt, and the first one is
never stopped (no orphan is recorded: its run id was never learnt)."""

from __future__ import annotations

import pytest

from broker.driver import decide
from broker.events import JobCreated, JobEvent
from broker.hermes.models import Busy, CreateOutcome, Draining, Unauthorized, Unavailable
from broker.jobs.policy import Policy
from broker.store.upstream_admission import need_of
from projections.job import JobView, apply

POLICY = Policy(hold_ms=600_000, resubmit=2, backoff_ms=100, backoff_max_ms=1_000, events_maxlen=40)
JOB = "job_" + "1" * 32


def held(view: JobView, outcome: CreateOutcome, at: int, upstream: str) -> JobView:
    events: list[JobEvent] = decide.on_create(view, 1, outcome, at, retry_at_ms=at + 1_000, policy=POLICY,
                                               upstream=upstream)  # fmt: skip
    for event in events:
        after = apply(view, event)
        assert after is not None
        view = after
    return view


def bound_after(replay: CreateOutcome) -> str | None:
    view = apply(None, JobCreated(job_id=JOB, at_ms=1_000, body='{"input":"x"}', fingerprint="f"))
    assert view is not None
    # Given a create to A whose answer was lost (a timeout: the run may be live on A)
    view = held(view, Unavailable("Hermes did not answer within 30 s.", unanswered=True), 31_000, "a:1")
    assert need_of(view, "a:1", {}, 0).bound == "a:1"
    # When A refuses the replay with an answer that says nothing about the first create
    view = held(view, replay, 40_000, "a:1")
    return need_of(view, "a:1", {}, 0).bound


@pytest.mark.parametrize(
    "replay",
    [
        Draining(1.0, "Gateway is draining existing work; retry shortly."),
        Unauthorized(401, "Invalid API key"),
        Unavailable("Hermes answered HTTP 500."),  # with Hermes's envelope: an answer, not about the create
        Unavailable("Hermes refused the connection."),  # restarting behind a load balancer
    ],
    ids=["draining", "unauthorized", "hermes-500", "refused"],
)
def test_a_refused_replay_keeps_the_job_bound_to_the_upstream_of_its_lost_answer(replay: CreateOutcome) -> None:
    # Then the job stays bound to A: A has not answered for the create, and it is not lost
    assert bound_after(replay) == "a:1"


def test_a_busy_replay_keeps_the_binding_too() -> None:
    # a 429 to the replay says the upstream is full now, not that the lost create made no run there (0.19.0 ignores
    # the key, and the lost create's run may be what fills it): the job waits for that upstream, as a session does
    assert bound_after(Busy(1.0, "Too many concurrent runs")) == "a:1"
