"""What an upstream reads as (SPEC S10): unreachable or lost while its calls fail, whatever refusal is stored; busy
only while Hermes answers 429 (nothing failed since) or the limit is reached; the detail of the current state."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.events import HoldReason
from broker.upstreams.condition import Condition, Refusal, shown
from broker.upstreams.health import Health

LOST = 10_000
T0 = 1_796_000_000_000
NAME = "hermes-2:8642"
TOO_MANY = "Too many concurrent runs (max 10)"
BUSY = Refusal(reason=HoldReason.BUSY, detail=TOO_MANY, since_ms=T0, at_ms=T0 + 500, retry_at_ms=T0 + 2_000)


def test_a_killed_upstream_that_answered_429_reads_unreachable_then_lost_never_busy() -> None:
    # Given a refusal of 429s stored, and every call since T0 + 1 s unanswered, at its limit
    failing = Health(answered_ms=T0 + 900, failing_since_ms=T0 + 1_000, failed_ms=T0 + 3_000)
    # When it is shown within the lost window, then past it
    soon = shown(NAME, BUSY, failing, 10, 10, T0 + 3_000, LOST, probe_at_ms=T0 + 4_000)
    later = shown(NAME, BUSY, failing, 10, 10, T0 + 12_000, LOST)
    # Then it is unreachable, then lost, with a detail of its own and when it began; never busy
    assert soon.condition is Condition.UNREACHABLE and later.condition is Condition.LOST
    for now in (soon, later):
        assert now.refusing is HoldReason.UNAVAILABLE and now.since_ms == T0 + 1_000
        assert TOO_MANY not in now.detail and NAME in now.detail
    assert soon.retry_at_ms == T0 + 4_000
    assert "lost" in later.detail and "lost" not in soon.detail


def test_busy_while_hermes_answers_429_and_not_after_a_failure_came_since() -> None:
    answering = Health(answered_ms=T0 + 600)
    current = shown(NAME, BUSY, answering, 3, 10, T0 + 700, LOST)
    assert (current.condition, current.refusing, current.detail) == (Condition.BUSY, HoldReason.BUSY, TOO_MANY)
    # it failed after that 429, then answered again: the 429 is no longer what it says
    back = Health(answered_ms=T0 + 5_000, failed_ms=T0 + 4_000)
    assert shown(NAME, BUSY, back, 3, 10, T0 + 5_100, LOST).condition is Condition.UP
    # a new 429 after the failure counts again
    again = Refusal(reason=HoldReason.BUSY, detail=TOO_MANY, since_ms=T0, at_ms=T0 + 4_500)
    assert shown(NAME, again, back, 3, 10, T0 + 5_100, LOST).condition is Condition.BUSY


def test_at_its_limit_it_is_busy_with_a_capacity_detail_and_refuses_nothing() -> None:
    now = shown(NAME, Refusal(), Health(answered_ms=T0), 4, 4, T0, LOST)
    assert (now.condition, now.refusing) == (Condition.BUSY, None)
    assert now.detail == f"Hermes {NAME} is at capacity (4 live runs)."


def test_a_refusal_of_an_answering_upstream_is_shown_as_stored() -> None:
    draining = Refusal(reason=HoldReason.DRAINING, detail="Draining.", since_ms=T0, retry_at_ms=T0 + 1_000)
    now = shown(NAME, draining, Health(answered_ms=T0 + 10, failed_ms=T0 + 20), 0, 4, T0 + 30, LOST)
    assert (now.condition, now.refusing, now.detail) == (Condition.REFUSING, HoldReason.DRAINING, "Draining.")


def test_a_lone_upstream_reads_unreachable_while_its_calls_fail_never_lost_never_busy() -> None:
    # Given a lone upstream (no lost window) that answered 429, then failed every call for a minute
    failing = Health(answered_ms=T0, failing_since_ms=T0 + 1_000, failed_ms=T0 + 60_000)
    now = shown(NAME, BUSY, failing, 1, 10, T0 + 60_000, 0)
    # Then it reads unreachable since then, with a detail of its own: never lost, never the stale 429
    assert (now.condition, now.refusing, now.since_ms) == (Condition.UNREACHABLE, HoldReason.UNAVAILABLE, T0 + 1_000)
    assert TOO_MANY not in now.detail and "lost" not in now.detail
    # And once it answers again, the 429 before the failures is not current
    back = Health(answered_ms=T0 + 61_000, failed_ms=T0 + 60_000)
    assert shown(NAME, BUSY, back, 1, 10, T0 + 61_000, 0).condition is Condition.UP
    # And a create it refused since says why, in the broker's words, its next create being the probe
    refused = Refusal(reason=HoldReason.UNAVAILABLE, detail="Hermes refused the connection.", since_ms=T0 + 2_000)
    now = shown(NAME, refused, failing, 0, 10, T0 + 60_000, 0)
    assert (now.condition, now.detail) == (Condition.UNREACHABLE, "Hermes refused the connection.")
    # but not one refused before its calls began to fail (a 401 answered then)
    earlier = Refusal(reason=HoldReason.UNAVAILABLE, detail="Invalid API key", since_ms=T0, at_ms=T0 + 500)
    assert "Invalid API key" not in shown(NAME, earlier, failing, 0, 10, T0 + 60_000, 0).detail


@given(
    answered=st.integers(0, 20_000),
    failing=st.integers(0, 20_000),
    failed=st.integers(0, 20_000),
    at=st.integers(0, 20_000),
    live=st.integers(0, 12),
    now=st.integers(0, 40_000),
)
def test_busy_is_shown_only_for_a_429_nothing_failed_after_or_a_full_limit(
    answered: int, failing: int, failed: int, at: int, live: int, now: int
) -> None:
    health = Health(answered_ms=answered, failing_since_ms=failing, failed_ms=failed)
    refusal = Refusal(reason=HoldReason.BUSY, detail=TOO_MANY, since_ms=at, at_ms=at)
    result = shown(NAME, refusal, health, live, 10, now, LOST)
    if failing:
        assert result.condition in (Condition.UNREACHABLE, Condition.LOST) and result.since_ms == failing
    elif result.condition is Condition.BUSY:
        assert failed <= at or live >= 10
    if result.detail == TOO_MANY:
        assert result.condition is Condition.BUSY and not failing and failed <= at
