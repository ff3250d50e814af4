"""The usage rebuild's comparison (SPEC S4.5, S7): pure, and tolerant of facts a sweep may or may not have counted."""

from __future__ import annotations

from broker.usage_rebuild import Recomputed, compare
from projections.usage import Used

HOUR = 1_796_000_400
START = Used(marker="j:1:a", key="k", at_ms=HOUR * 1000, runs_started=1)
END = Used(marker="j:end", key="k", at_ms=HOUR * 1000 + 5, runs_completed=1, hermes_ms=5)


def recomputed(*facts: Used) -> Recomputed:
    rebuilt = Recomputed()
    for used in facts:
        rebuilt.add(used)
    return rebuilt


def test_a_fact_waiting_for_a_sweep_may_be_counted_or_not() -> None:
    rebuilt = recomputed(START, END, END)  # a fact read twice counts once
    counted = rebuilt.without([END, END])
    assert counted.counters[HOUR] == {"k": (1, 0, 0, 0, 0, 0, 0, 0)} and counted.markers[HOUR] == {"j:1:a"}
    for stored in ((1, 0, 0, 0, 0, 0, 0, 0), (1, 1, 0, 0, 5, 0, 0, 0)):
        assert compare([HOUR], [{"k": stored}], counted, rebuilt) == []


def test_a_bucket_outside_what_the_streams_allow_is_a_difference() -> None:
    rebuilt = recomputed(START, END)
    counted = rebuilt.without([])
    for stored in ({}, {"k": (2, 1, 0, 0, 5, 0, 0, 0)}, {"k": (1, 1, 0, 0, 5, 0, 0, 0), "other": (1,) * 8}):
        [*found] = compare([HOUR], [stored], counted, rebuilt)
        assert found and all(difference.hour == HOUR for difference in found)
    [difference] = compare([HOUR], [{}], counted, rebuilt)
    assert (difference.key, difference.stored, difference.rebuilt) == ("k", (0,) * 8, (1, 1, 0, 0, 5, 0, 0, 0))
    assert difference.line()["usage"] == {"hour": HOUR, "key": "k"}
