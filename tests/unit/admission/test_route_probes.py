"""Routing (SPEC S10 "One line for all": the job at its head goes to ... the upstream with the
lowest share of its limit in use)."""

from __future__ import annotations

from broker.admission.route import Need, Standing, route
from broker.events import HoldReason

NOW = 10_000_000


def test_an_unbound_job_goes_to_an_idle_upstream_before_a_busy_ones_probe() -> None:
    # Given a fleet where Hermes A (pinned at 4) answers 429 because other callers share it: 3 of the broker's runs
    # are live there and its one probe slot is free; B is idle
    busy = Standing(name="a", limit=4, in_use=3, free=1, refusing=HoldReason.BUSY, refusing_since_ms=NOW - 1_000)
    idle = Standing(name="b", limit=4, in_use=0, free=4)
    # When the head of the line (no session) is routed
    choice = route([busy, idle], Need(), NOW)
    # Then it goes to the upstream with the lowest share in use, not to the one that just said it is full (the
    # docstring's "refusing but answering first" is meant for draining/5xx/401, `Standing.refuses` excludes BUSY)
    assert choice.upstream == "b"
