"""A late key behind a backlog and an earlier newcomer's long run, in the pure model (broker/admission/cost_line.py;
SPEC S4.2 "What a turn costs")."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from broker.admission.cost import CostMode, CostSettings
from broker.admission.cost_line import CostLine, Job, backlog, simulate

S = 1_000  # ms


@settings(max_examples=30, deadline=None)
@example(run_ms=1_000, slots=2, long_ms=20_000)
@given(
    st.integers(1, 5).map(lambda s: s * S),
    st.integers(1, 6),
    st.integers(20, 120).map(lambda s: s * S),
)
def test_a_late_key_does_not_wait_for_an_earlier_newcomers_overrun(run_ms: int, slots: int, long_ms: int) -> None:
    # One newcomer's run far longer than its pacing moves V on by nothing: a key arriving later does not wait while
    # the backlog runs off another key's overrun (S4.2: a late key starts within about one round).
    line = CostLine(settings=CostSettings(CostMode.TIME, guess=run_ms), slots=slots)
    jobs = backlog("a", 40 * slots + 10 * long_ms * slots // run_ms, run_ms)
    # Given key a's backlog (its runs learnt), and key n's one job of a long run that arrived and settled
    jobs.append(Job("n-0", "n", 5 * run_ms, long_ms))
    arrive = 5 * run_ms + long_ms + 3 * run_ms + 1  # n has run and settled (it starts within a round of arriving)
    # When key c arrives with one job
    jobs.append(Job("c-0", "c", arrive, run_ms))
    simulate(line, jobs, arrive + 20 * long_ms)
    assert any(start.job == "n-0" and start.at_ms + long_ms < arrive for start in line.starts)
    # Then c starts within about one round (a's one job, give or take the slot freeing at the same moment)
    after = [start for start in line.starts if start.at_ms >= arrive]
    first = next(n for n, start in enumerate(after) if start.key == "c")
    assert first <= 2, (first, [(start.key, start.at_ms) for start in after[:3]])
