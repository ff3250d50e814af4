"""What a waiting job shows of the admission line (SPEC S3.2 `hold`, S4.1), and its place in the line."""

from __future__ import annotations

from broker.admission import fair
from broker.admission.route import Need
from broker.admission.state import LineState, UpstreamFigures, line_place, shown_hold
from broker.events import HoldReason, JobCreated, JobHeld, RunAccepted, RunInterrupted, RunResubmitted
from projections.job import Hold, JobView, fold

JOB = "job_" + "1" * 32
T0 = 1_796_005_747_391


def view(*events: object) -> JobView:
    folded = fold([JobCreated(job_id=JOB, at_ms=T0, body="{}", fingerprint="f"), *events])  # type: ignore[list-item]
    assert folded is not None
    return folded


def line(**changes: object) -> LineState:
    fields: dict[str, object] = {"limit": 10, "learnt": True, "live": 3, "waiting": 5, "oldest_wait_ms": 100}
    return LineState(**{**fields, **changes})  # type: ignore[arg-type]


def test_a_waiting_job_shows_the_refusal_with_its_own_since_and_the_line_retry_at() -> None:
    refusing = line(refusing=HoldReason.BUSY, detail="Too many concurrent runs (max 10)", retry_at_ms=T0 + 9_000)
    assert shown_hold(view(), refusing, T0 + 5_000) == Hold(
        HoldReason.BUSY, T0, T0 + 9_000, "Too many concurrent runs (max 10)"
    )


def test_a_job_that_was_the_probe_keeps_the_since_of_its_first_hold() -> None:
    held = JobHeld(job_id=JOB, at_ms=T0 + 2_000, reason=HoldReason.UNAVAILABLE, retry_at_ms=T0 + 3_000, since_ms=T0)
    refusing = line(refusing=HoldReason.UNAVAILABLE, detail="Hermes refused the connection.", retry_at_ms=T0 + 7_000)
    shown = shown_hold(view(held), refusing, T0 + 6_000)
    assert shown is not None and (shown.since_ms, shown.retry_at_ms) == (T0, T0 + 7_000)


def test_a_full_limit_is_a_busy_hold_in_the_broker_words() -> None:
    shown = shown_hold(view(), line(live=10), T0 + 1_000)
    assert shown == Hold(HoldReason.BUSY, T0, T0 + 1_000, "Hermes is at capacity (10 live runs).")


def test_no_hold_when_the_line_has_room_or_the_job_runs_or_ended() -> None:
    accepted = RunAccepted(job_id=JOB, at_ms=T0 + 1, attempt=1, hermes_run_id="run_1")
    refusing = line(refusing=HoldReason.BUSY, detail="x", retry_at_ms=T0 + 9_000)
    assert shown_hold(view(), line(), T0 + 1) is None
    assert shown_hold(view(accepted), refusing, T0 + 2) is None


def test_a_resubmit_is_placed_ahead_of_every_first_attempt() -> None:
    first = line_place(view())
    resubmitted = view(
        RunAccepted(job_id=JOB, at_ms=T0 + 1, attempt=1, hermes_run_id="run_1"),
        RunInterrupted(job_id=JOB, at_ms=T0 + 2, attempt=1, hermes_run_id="run_1", reason="not_found"),
        RunResubmitted(job_id=JOB, at_ms=T0 + 2, attempt=2),
    )
    assert first == str(fair.front(3))  # a lost place of a first attempt: the front of its priority's band
    assert float(line_place(resubmitted)) == T0  # created ms, below every band and every legacy place (ms * 1000)
    assert float(line_place(resubmitted)) < T0 * 1000 < fair.BASE


def test_with_several_upstreams_a_job_is_held_only_while_none_of_them_can_take_it() -> None:
    # SPEC S10: the first upstream refusing, the second with room: no hold (the line moves to the second)
    first = UpstreamFigures(name="a", limit=4, learnt=True, live=0, refusing=HoldReason.UNAVAILABLE, retry_at_ms=T0)
    roomy = UpstreamFigures(name="b", limit=6, learnt=True, live=2)
    full = UpstreamFigures(name="b", limit=6, learnt=True, live=6)
    draining = UpstreamFigures(
        name="b", limit=6, learnt=True, live=0, refusing=HoldReason.DRAINING, detail="Draining.", retry_at_ms=T0 - 5
    )
    assert shown_hold(view(), line(upstreams=(first, roomy)), T0 + 1) is None
    # every one full or refusing: busy, with the capacity of those that take creates
    assert shown_hold(view(), line(upstreams=(first, full)), T0 + 1) == Hold(
        HoldReason.BUSY, T0, T0 + 1, "Hermes is at capacity (6 live runs)."
    )
    # every one refusing: the refusal whose probe comes first, in its own words
    assert shown_hold(view(), line(upstreams=(first, draining)), T0 + 1) == Hold(
        HoldReason.DRAINING, T0, T0, "Draining."
    )


def test_a_job_bound_to_a_busy_upstream_shows_that_upstreams_hold_while_others_have_room() -> None:
    # SPEC S10 + S3.2: a session's job waits for its session's upstream while it is busy; the hold says so
    busy = UpstreamFigures(name="a", limit=4, learnt=True, live=4)
    roomy = UpstreamFigures(name="b", limit=6, learnt=True, live=0)
    session = Need(bound="a", patience_ms=30_000)
    assert shown_hold(view(), line(upstreams=(busy, roomy)), T0 + 1, session) == Hold(
        HoldReason.BUSY, T0, T0 + 1, "Hermes a is at capacity (4 live runs)."
    )
    refused = UpstreamFigures(name="a", limit=4, learnt=False, live=4, refusing=HoldReason.BUSY, detail="Too many",
                              since_ms=T0, retry_at_ms=T0 + 2_000)  # fmt: skip
    assert shown_hold(view(), line(upstreams=(refused, roomy)), T0 + 1, session) == Hold(
        HoldReason.BUSY, T0, T0 + 2_000, "Too many"
    )
    # unbound, or bound to the one with room: no hold
    assert shown_hold(view(), line(upstreams=(busy, roomy)), T0 + 1, Need()) is None
    assert shown_hold(view(), line(upstreams=(busy, roomy)), T0 + 1, Need(bound="b")) is None


def test_a_bound_job_shows_its_down_upstream_only_within_its_patience() -> None:
    down = UpstreamFigures(name="a", limit=4, learnt=True, live=0, refusing=HoldReason.UNAVAILABLE,
                           detail="Hermes refused the connection.", since_ms=T0, retry_at_ms=T0 + 1_000)  # fmt: skip
    roomy = UpstreamFigures(name="b", limit=6, learnt=True, live=0)
    session = Need(bound="a", patience_ms=30_000)
    within = shown_hold(view(), line(upstreams=(down, roomy)), T0 + 10_000, session)
    assert within is not None and within.reason is HoldReason.UNAVAILABLE
    # past the grace (or a resubmit, patience 0, or a lost upstream) it goes elsewhere: no hold while b has room
    assert shown_hold(view(), line(upstreams=(down, roomy)), T0 + 30_000, session) is None
    assert shown_hold(view(), line(upstreams=(down, roomy)), T0 + 1, Need(bound="a")) is None
    lost = UpstreamFigures(name="a", limit=4, learnt=True, live=4, lost=True)
    assert shown_hold(view(), line(upstreams=(lost, roomy)), T0 + 1, session) is None
