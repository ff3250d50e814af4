"""An upstream's health (SPEC S10 "What counts as an answer", "A lost upstream"): the pure model, property-tested.

A replica's calls are a timeline of answers and failures; the model must call the upstream lost exactly when every
call of every replica has failed, without an answer in between, for HERMES_UPSTREAM_LOST."""

from __future__ import annotations

from functools import reduce

from hypothesis import given
from hypothesis import strategies as st

from broker.upstreams.health import (
    FIRST_PROBE_GAP_MS,
    Health,
    Heard,
    Reach,
    answered,
    failed,
    is_lost,
    merge,
    probe_gap,
    reach,
    report_due,
)

LOST = 8_000

#: (at ms, answered?) calls of one replica, in time order (one per ms: which came first is then never in doubt)
calls = st.lists(st.tuples(st.integers(1, 60_000), st.booleans()), max_size=30, unique_by=lambda c: c[0]).map(sorted)


def heard_of(timeline: list[tuple[int, bool]]) -> Heard:
    return reduce(lambda h, call: answered(h, call[0]) if call[1] else failed(h, call[0]), timeline, Heard())


def truth(timelines: list[list[tuple[int, bool]]], now: int) -> bool:
    """Lost by the contract: some call failed, and every call since the first failure after the last answer failed,
    for the whole window (all replicas together)."""
    merged = sorted(call for timeline in timelines for call in timeline)
    last_answer = max((at for at, ok in merged if ok), default=0)
    failures = [at for at, ok in merged if not ok and at > last_answer]
    return bool(failures) and now - min(failures) >= LOST


@given(st.lists(calls, min_size=1, max_size=3), st.integers(0, 80_000))
def test_lost_exactly_when_every_call_failed_for_the_whole_window(
    timelines: list[list[tuple[int, bool]]], after: int
) -> None:
    now = max((at for timeline in timelines for at, _ in timeline), default=0) + after
    shared = reduce(merge, (heard_of(timeline) for timeline in timelines), Health())
    merged = sorted(call for timeline in timelines for call in timeline)
    answers = [at for at, ok in merged if ok]
    failures_after = [at for at, ok in merged if not ok and at > (answers[-1] if answers else 0)]
    if not failures_after:
        assert not shared.failing and not is_lost(shared, now, LOST)  # never lost before a failure streak
    else:
        # the streak is counted from no earlier than its first failure: never lost before the window
        assert shared.failing_since_ms >= failures_after[0]
        if is_lost(shared, now, LOST):
            assert truth(timelines, now)


@given(calls, st.integers(0, 80_000))
def test_one_replica_alone_is_lost_exactly_by_the_contract(timeline: list[tuple[int, bool]], after: int) -> None:
    now = (timeline[-1][0] if timeline else 0) + after
    shared = merge(Health(), heard_of(timeline))
    assert is_lost(shared, now, LOST) == truth([timeline], now)


def test_one_failed_call_after_an_idle_spell_is_not_a_lost_upstream() -> None:
    heard = failed(answered(Heard(), 1_000), 13_000)  # an answer, 12 s idle, then a refused connection
    shared = merge(Health(), heard)
    assert reach(shared, 13_600, LOST) is Reach.UNREACHABLE
    assert reach(shared, 13_000 + LOST - 1, LOST) is Reach.UNREACHABLE
    assert reach(shared, 13_000 + LOST, LOST) is Reach.LOST


def test_a_brief_refusal_while_a_run_streams_is_over_at_its_next_event() -> None:
    shared = merge(Health(), failed(answered(Heard(), 1_000), 1_100))  # a create refused while a run streams
    stream = answered(Heard(), 1_200)  # the run's next event, 0.1 s later
    assert not merge(shared, stream).failing


def test_an_upstream_never_heard_since_start_is_lost_after_a_whole_window_of_failures() -> None:
    shared = merge(Health(), failed(failed(Heard(), 500), 20_000))
    assert reach(shared, 500 + LOST - 1, LOST) is Reach.UNREACHABLE
    assert reach(shared, 25_500, LOST) is Reach.LOST


def test_a_replica_still_failing_after_anothers_answer_counts_from_its_latest_failure() -> None:
    lone = failed(failed(Heard(), 1_000), 9_000)  # replica X fails from 1 s on
    shared = merge(Health(answered_ms=5_000), lone)  # replica Y got an answer at 5 s
    assert shared.failing_since_ms == 9_000


@given(calls, calls)
def test_merging_reports_in_either_order_gives_the_same_health(
    a: list[tuple[int, bool]], b: list[tuple[int, bool]]
) -> None:
    x, y = heard_of(a), heard_of(b)
    one, other = merge(merge(Health(), x), y), merge(merge(Health(), y), x)
    assert one.answered_ms == other.answered_ms
    assert bool(one.failing) == bool(other.failing)


def test_a_report_is_due_on_a_change_of_streak_and_when_an_answer_would_end_the_shared_one() -> None:
    quiet = answered(Heard(), 1_000)
    failing = failed(quiet, 2_000)
    assert report_due(failing, quiet, Health(answered_ms=1_000))  # a streak began
    assert not report_due(failing, failing, Health(1_000, 2_000, 2_000))  # nothing new
    assert report_due(failing, failing, Health(answered_ms=3_000))  # the shared state forgot it: say it again
    back = answered(failing, 4_000)
    assert report_due(back, failing, Health(1_000, 2_000, 2_000))  # the streak is over
    assert not report_due(answered(quiet, 1_500), quiet, Health(answered_ms=1_000))  # answers alone: no write
    assert report_due(answered(quiet, 2_500), quiet, Health(1_000, 2_000, 2_000))  # another's streak ends here


@given(st.integers(0, 10**9), st.integers(1, 10**6), st.integers(100, 60_000))
def test_a_failing_upstream_is_probed_soon_at_first_and_once_per_interval_later(
    since: int, failing_for: int, interval: int
) -> None:
    health = Health(answered_ms=0, failing_since_ms=since + 1, failed_ms=since + 1)
    gap = probe_gap(health, since + 1 + failing_for, interval)
    assert min(FIRST_PROBE_GAP_MS, interval) <= gap <= interval
    if failing_for <= 4 * FIRST_PROBE_GAP_MS:  # a brief fault: found over within a fraction of a second
        assert gap == min(FIRST_PROBE_GAP_MS, interval)
    if failing_for >= 4 * interval:  # a long one: a probe per interval
        assert gap == interval
