"""When an upstream counts as lost (SPEC S10): calls to it get no answer, and none has for HERMES_UPSTREAM_LOST."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.store.upstream_admission import is_lost

LOST = 300_000


def test_an_idle_or_never_answering_upstream_is_not_lost() -> None:
    assert not is_lost(None, None, 10**12, LOST)  # never called
    assert not is_lost("1000", None, 10**12, LOST)  # answered, then nobody asked: idle, not silent
    assert not is_lost(None, "5000", 10**12, LOST)  # never answered at all: not known to have been there
    assert not is_lost("1000", "900", 10**12, LOST)  # the last call got an answer


def test_a_silent_upstream_is_lost_once_its_last_answer_is_older_than_the_lost_time() -> None:
    assert not is_lost("1000", "2000", 1000 + LOST - 1, LOST)
    assert is_lost("1000", "2000", 1000 + LOST, LOST)


@given(st.integers(1, 10**9), st.integers(0, 10**9), st.integers(0, 10**10))
def test_lost_needs_a_failure_after_the_last_answer_and_the_lost_time_since_it(
    answered: int, failed: int, now: int
) -> None:
    assert is_lost(str(answered), str(failed), now, LOST) == (failed > answered and now - answered >= LOST)
