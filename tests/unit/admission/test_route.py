"""Routing a granted job (SPEC S10), a pure decision: properties over any upstreams' standings and jobs."""

from __future__ import annotations

from fractions import Fraction

import attrs
from hypothesis import given
from hypothesis import strategies as st

from broker.admission.route import UNTIL_LOST, Choice, Need, Standing, route, route_all, take
from broker.events import HoldReason

NAMES = ["hermes-1:8642", "hermes-2:8642", "10.0.0.7:8642/agent", "h4"]
NOW = 10_000_000
GRACE = 30_000


@st.composite
def standings(draw: st.DrawFn) -> list[Standing]:
    count = draw(st.integers(1, len(NAMES)))
    found = []
    for name in NAMES[:count]:
        limit = draw(st.integers(1, 12))
        in_use = draw(st.integers(0, limit))
        refusing = draw(st.sampled_from([None, None, *HoldReason]))
        failing = refusing is HoldReason.UNAVAILABLE and draw(st.booleans())  # its calls fail (health.py)
        found.append(
            Standing(
                name=name,
                limit=limit,
                in_use=in_use,
                free=draw(st.integers(0, min(1, limit - in_use) if refusing else limit - in_use)),
                refusing=refusing,
                refusing_since_ms=NOW - draw(st.integers(0, 2 * GRACE)) if refusing else 0,
                lost=draw(st.booleans()) if failing else False,
                failing_since_ms=NOW - draw(st.integers(1, 2 * GRACE)) if failing else 0,
            )
        )
    return found


needs = st.builds(
    Need,
    bound=st.sampled_from([None, *NAMES, "gone:1"]),
    patience_ms=st.sampled_from([0, GRACE, UNTIL_LOST]),
)


def rank(standing: Standing) -> int:
    """A refusing upstream's probe first when it refuses for another reason than being busy; a busy one's last."""
    return 1 if standing.refusing is None else 2 if standing.refusing is HoldReason.BUSY else 0


def usable(states: list[Standing], standing: Standing) -> bool:
    """Can it take a create? A free slot, and in a fleet its calls answered (a failing one is probed without jobs)."""
    return standing.free > 0 and not (len(states) > 1 and standing.failing)


def waits_for_bound(states: list[Standing], need: Need) -> Standing | None:
    bound = next((s for s in states if s.name == need.bound), None)
    if bound is not None and (not bound.down or bound.down_for(NOW) < need.patience_ms):
        return bound
    return None


@given(standings(), st.lists(needs, max_size=40))
def test_no_upstream_is_given_more_jobs_than_its_free_slots(states: list[Standing], jobs: list[Need]) -> None:
    choices = route_all(states, jobs, NOW)
    for standing in states:
        assert sum(1 for c in choices if c.upstream == standing.name) <= standing.free


@given(standings(), st.lists(needs, max_size=40))
def test_no_job_waits_while_an_upstream_it_may_use_has_a_free_slot(states: list[Standing], jobs: list[Need]) -> None:
    current = list(states)
    for need in jobs:
        choice = route(current, need, NOW)
        bound = waits_for_bound(current, need)
        if choice.upstream is None:
            if bound is not None:
                assert not usable(current, bound)  # it waits only for its own upstream: busy, or failing
            else:
                assert not any(usable(current, s) for s in current)  # its own upstream's probe included
        else:
            current = take(current, choice.upstream)


@given(standings(), needs)
def test_a_job_bound_to_an_upstream_that_is_up_goes_there_or_waits(states: list[Standing], need: Need) -> None:
    choice = route(states, need, NOW)
    bound = waits_for_bound(states, need)
    if bound is not None:
        assert choice == Choice(upstream=bound.name if usable(states, bound) else None)
    elif choice.upstream is not None and choice.upstream == need.bound:
        # down past its patience with nowhere else to go: it takes its own upstream's probe, unmoved
        assert not any(usable(states, s) for s in states if s.name != need.bound) and choice.moved_from is None
    elif choice.upstream is not None:  # down past its patience (or gone): it moves, and says so
        assert choice.moved_from == need.bound and (choice.reason is None) == (need.bound is None)


@given(standings())
def test_a_free_job_goes_to_a_down_ones_probe_first_then_the_lowest_share_a_busy_ones_probe_last_never_a_failing_one(
    states: list[Standing],
) -> None:
    choice = route(states, Need(), NOW)
    open_ = [s for s in states if usable(states, s)]
    if not open_:
        assert choice == Choice(upstream=None)
        return
    chosen = next(s for s in states if s.name == choice.upstream)
    assert choice.moved_from is None
    for other in open_:
        assert (rank(chosen), chosen.share) <= (rank(other), other.share)


def test_a_refusing_upstream_that_answers_gets_its_probe_while_another_has_room() -> None:
    # it refused once (a brief fault); its probe is due (one free slot): the next job goes there, so it is found up
    refused = Standing(name="a", limit=4, in_use=0, free=1, refusing=HoldReason.UNAVAILABLE, refusing_since_ms=NOW - 5)
    roomy = Standing(name="b", limit=4, in_use=0, free=4)
    assert route_all([refused, roomy], [Need()] * 3, NOW) == [
        Choice(upstream="a"),
        Choice(upstream="b"),
        Choice(upstream="b"),
    ]
    # while its calls fail (unreachable, or lost) it gets no create: its health probe finds it back
    unreachable = attrs.evolve(refused, failing_since_ms=NOW - 5)
    assert route_all([unreachable, roomy], [Need()] * 3, NOW) == [Choice(upstream="b")] * 3
    lost = attrs.evolve(unreachable, lost=True)
    assert route_all([lost, roomy], [Need()] * 5, NOW) == [Choice(upstream="b")] * 4 + [Choice(upstream=None)]


def test_the_spread_fills_each_upstream_in_proportion_to_its_limit() -> None:
    states = [
        Standing(name="a", limit=4, in_use=0, free=4),
        Standing(name="b", limit=6, in_use=0, free=6),
        Standing(name="c", limit=10, in_use=0, free=10),
    ]
    choices = route_all(states, [Need()] * 10, NOW)
    counts = {name: sum(1 for c in choices if c.upstream == name) for name in "abc"}
    assert counts == {"a": 2, "b": 3, "c": 5}
    assert all(c.upstream for c in route_all(states, [Need()] * 20, NOW))
    assert route_all(states, [Need()] * 21, NOW)[-1] == Choice(upstream=None)


def test_a_session_waits_for_its_busy_upstream_and_moves_after_the_grace_of_it_being_down() -> None:
    busy = Standing(name="a", limit=2, in_use=2, free=0, refusing=HoldReason.BUSY, refusing_since_ms=0)
    other = Standing(name="b", limit=2, in_use=0, free=2)
    session = Need(bound="a", patience_ms=GRACE)
    assert route([busy, other], session, NOW) == Choice(upstream=None)  # busy is never down: it waits
    down = Standing(name="a", limit=2, in_use=0, free=1, refusing=HoldReason.UNAVAILABLE, refusing_since_ms=NOW - 5)
    assert route([down, other], session, NOW) == Choice(upstream="a")  # within the grace: its probe
    late = Standing(name="a", limit=2, in_use=0, free=1, refusing=HoldReason.UNAVAILABLE, refusing_since_ms=NOW - GRACE)
    assert route([late, other], session, NOW) == Choice(upstream="b", moved_from="a", reason="unavailable")
    resubmit = Need(bound="a", patience_ms=0)  # an interrupted run's upstream: elsewhere as soon as it is down
    assert route([down, other], resubmit, NOW) == Choice(upstream="b", moved_from="a", reason="unavailable")
    # no longer listed: it goes where any free job would (a refusing upstream's due probe first)
    assert route([down, other], Need(bound="gone"), NOW) == Choice(upstream="a", moved_from="gone", reason="removed")
    assert route([other], Need(bound="gone"), NOW) == Choice(upstream="b", moved_from="gone", reason="removed")
    alone = Choice(upstream="a")  # nowhere else to go: its own upstream's probe, not moved
    assert route([down], resubmit, NOW) == alone and route([late], session, NOW) == alone
    assert route([down, Standing(name="b", limit=2, in_use=2, free=0)], resubmit, NOW) == alone
    lost = Standing(name="a", limit=2, in_use=0, free=0, lost=True, failing_since_ms=1)
    assert route([lost, other], session, NOW) == Choice(upstream="b", moved_from="a", reason="lost")
    # unreachable (its calls fail) within the grace: the session waits for it, without a create there
    failing = attrs.evolve(down, failing_since_ms=NOW - 5)
    assert route([failing, other], session, NOW) == Choice(upstream=None)


def test_a_create_whose_answer_was_lost_stays_bound_to_its_upstream_until_it_is_lost() -> None:
    unanswered = Need(bound="a", patience_ms=UNTIL_LOST)
    other = Standing(name="b", limit=2, in_use=0, free=2)
    silent = Standing(name="a", limit=2, in_use=1, free=1, refusing=HoldReason.UNAVAILABLE, failing_since_ms=1)
    assert route([silent, other], unanswered, NOW) == Choice(upstream=None)  # however long, while not lost
    answering = attrs.evolve(silent, failing_since_ms=0, refusing_since_ms=1)
    assert route([answering, other], unanswered, NOW) == Choice(upstream="a")  # the replay of its create, there
    lost = attrs.evolve(silent, lost=True)
    assert route([lost, other], unanswered, NOW) == Choice(upstream="b", moved_from="a", reason="lost")


def test_a_job_bound_to_a_down_upstream_with_nowhere_else_to_go_takes_its_probe() -> None:
    # one Hermes, restarting: the interrupted run's resubmit is the only job waiting, and its create is the probe
    # that finds Hermes back (else a lone down upstream would never be probed, and the job would wait for ever)
    down = Standing(name="a", limit=2, in_use=0, free=1, refusing=HoldReason.UNAVAILABLE, refusing_since_ms=0)
    assert route([down], Need(bound="a", patience_ms=0), NOW) == Choice(upstream="a")
    assert route([down], Need(bound="a", patience_ms=GRACE), NOW) == Choice(upstream="a")
    full = Standing(name="b", limit=1, in_use=1, free=0)
    assert route([down, full], Need(bound="a"), NOW) == Choice(upstream="a")  # the other has no room either
    paced = attrs.evolve(down, free=0)  # between probes: it waits
    assert route([paced], Need(bound="a"), NOW) == Choice(upstream=None)


def test_share_is_exact() -> None:
    assert Standing(name="a", limit=3, in_use=1, free=0).share == Fraction(1, 3)
