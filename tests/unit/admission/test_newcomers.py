"""The latest jobs a replica heard to start at V, and where its passes move V for them (SPEC S4.2)."""

from __future__ import annotations

from broker.admission.newcomers import Newcomers


def test_v_moves_past_the_latest_newcomers_by_what_they_cost_counting_at_most_a_limits_worth() -> None:
    heard = Newcomers(5)
    assert heard.past(3, room=10) is None
    heard.entered(3, 50_000, 10_000)
    assert heard.past(3, room=10) == 60_000
    for advance in (2_500, 10_000, 10_000):  # more arrived at the same V (together with it)
        heard.entered(3, 50_000, advance)
    assert heard.past(3, room=10) == 50_000 + 32_500
    assert heard.past(3, room=2) == 50_000 + 16_250  # a burst beyond the limit: no debt
    heard.entered(3, 40_000, 10_000)  # a create on a replica whose V lagged: already behind
    heard.entered(3, 90_000, 10_000)  # the next V: the latest
    assert heard.past(3, room=10) == 100_000
    assert heard.past(2, room=10) is None
    heard.entered(7, 0, 10_000)  # no such priority
    heard.entered(1, 0, 0)
    assert heard.past(1, room=10) is None
