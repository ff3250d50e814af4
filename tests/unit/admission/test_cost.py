"""What a turn costs (SPEC S4.2): the charging and ordering of broker/admission/cost.py, and properties of the whole
line with costs as the store would keep it (broker/admission/cost_line.py: partitions, Hermes slots, runs of given
lengths, settles, resubmits, stops, replicas that die between two writes)."""

from __future__ import annotations

import itertools

import pytest
from attrs import evolve
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.admission import cost, fair
from broker.admission.cost import CostMode, CostSettings, History, KeyLine
from broker.admission.cost_line import CostLine, Job, backlog, shares, simulate

S = 1_000  # ms
TIME = CostSettings(CostMode.TIME)
WEIGHTS = [0.5, 1.0, 2.0, 3.0]


def time_shares(line: CostLine, keys: list[str], since_ms: int = 0, until_ms: int | None = None) -> dict[str, float]:
    """Each key's share of the Hermes time of the runs started in [since, until)."""
    return shares(line.starts, keys, since_ms, line.now + 1 if until_ms is None else until_ms, hermes_time=True)


def cost_shares(line: CostLine, keys: list[str], since_ms: int = 0) -> dict[str, float]:
    """Each key's share of what the runs started since `since_ms` cost (the line's mode)."""
    return shares(line.starts, keys, since_ms, line.now + 1)


def weight_shares(weights: dict[str, float]) -> dict[str, float]:
    total = sum(weights.values())
    return {key: weight / total for key, weight in weights.items()}


# the charging ----------------------------------------------------------------------------------------------------


def test_runs_mode_charges_what_fair_advance_does_and_time_charges_slot_ms_per_weight() -> None:
    for weight in (1e-12, 0.25, 2 / 3, 1.0, 3.0, 700.0, 1_000.0):
        assert cost.charge(fair.UNIT, weight) == fair.advance(weight)
    runs = CostSettings(CostMode.RUNS)
    assert cost.estimate(History(), runs, 3.0) == fair.advance(3.0)
    assert cost.estimate(History(), TIME, 1.0) == cost.GUESS
    assert cost.estimate(History(), TIME, 2.0) == cost.GUESS // 2
    assert cost.charge(0.0, 1.0) == cost.FLOOR  # a run is never free: a key's next tag is past its last
    assert cost.measured(TIME, 12_345, None) == 12_345.0
    assert cost.measured(CostSettings(CostMode.TOKENS), 12_345, 800) == 800.0
    assert cost.measured(CostSettings(CostMode.TOKENS), 12_345, None) is None  # no usage: its estimate stands
    assert cost.measured(runs, None, None) == fair.UNIT


def test_the_estimate_is_the_guess_then_the_average_of_the_latest_runs() -> None:
    history = History()
    assert history.estimate(CostSettings(guess=5_000)) == 5_000
    for run in (1_000, 3_000):
        history = history.settled(run)
    assert history.estimate(TIME) == 2_000  # exact for the first HISTORY runs
    for _ in range(40):
        history = history.settled(10_000)
    assert abs(history.estimate(TIME) - 10_000) < 50  # then it follows the latest


def test_a_key_has_one_front_its_other_jobs_are_parked_and_a_grant_charges_its_chain() -> None:
    line, first = cost.enter(KeyLine(), "j1", virtual=500, advance=60_000)
    assert (first.tag, first.parked, first.at_v) == (500, False, True)  # an idle key starts at V
    line, second = cost.enter(line, "j2", virtual=500, advance=60_000)
    line, third = cost.enter(line, "j3", virtual=500, advance=60_000)
    assert second.parked and third.parked and second.tag < third.tag  # parked in arrival order
    line, charge, front = cost.granted(line, "j1", ("k", 3, 1.0), virtual=9_999, advance=60_000)
    assert charge is not None and (charge.start, charge.units, charge.at_v) == (500, 60_000, True)
    # the next job is the front at F = 500 + 60000, whatever V did meanwhile (the key waited: its chain)
    assert front is not None and (front.job, front.tag, front.parked) == ("j2", 60_500, False)
    # the run took 1 s: the key gets 59 s back while it waits
    line, delta = cost.settled(line, charge, 1_000, virtual=70_000, advance=1_000)
    assert delta == -59_000 and line.finish == 1_500
    # of a charge of the guess, down to one turn (its new estimate, 1 s) behind V (V moved by the guess too)
    guessed = evolve(charge, guessed=True)
    low, delta = cost.settled(evolve(line, finish=60_500), guessed, 1_000, virtual=2_000, advance=1_000)
    assert (low.finish, delta) == (1_500, -59_000)  # V behind: all of it back
    behind, clipped = cost.settled(evolve(line, finish=80_000), guessed, 1_000, virtual=70_000, advance=1_000)
    assert (behind.finish, clipped) == (69_000, -11_000)
    lifted, clipped = cost.settled(evolve(line, finish=500), guessed, 1_000, virtual=70_000, advance=1_000)
    assert (lifted.finish, clipped) == (69_000, 68_500)  # a credit a settle before V moved left is trimmed too
    line, moved = cost.retagged(line, advance=1_000)
    assert moved is not None and (moved.job, moved.tag, moved.advance) == ("j2", 1_500, 1_000)
    # a second call for j1 (after a crash) charges nothing and gives the front to place again
    again, nothing, same = cost.granted(line, "j1", ("k", 3, 1.0), virtual=70_000, advance=1_000, charged=True)
    assert nothing is None and same == moved and again.finish == line.finish


def test_an_idle_key_banks_no_credit_but_keeps_a_debt() -> None:
    line, _ = cost.enter(KeyLine(), "j1", virtual=0, advance=60_000)
    line, charge, _ = cost.granted(line, "j1", ("k", 3, 1.0), virtual=0, advance=60_000)
    assert charge is not None and not line.queue
    credit, _ = cost.settled(line, charge, 1_000, virtual=30_000, advance=1_000)  # idle, F behind V: forgotten
    assert credit.finish is None
    _, back = cost.enter(credit, "j2", virtual=30_000, advance=1_000)
    assert back.tag == 30_000
    # idle, cost more: from max(F, V)
    debt, delta = cost.settled(line, charge, 100_000, virtual=30_000, advance=100_000)
    assert delta == 40_000 and debt.finish == 100_000
    _, late = cost.enter(debt, "j2", virtual=30_000, advance=1_000)
    assert late.tag == 100_000 and not late.at_v
    assert charge.paced == 60_000  # V moved past it by its pacing: a newcomer


def test_a_stopped_front_hands_the_line_to_the_next_job_without_a_charge() -> None:
    line = KeyLine()
    for job in ("j1", "j2", "j3"):
        line, _ = cost.enter(line, job, virtual=0, advance=10)
    line, front = cost.left(line, "j1")
    assert front is not None and (front.job, front.tag) == ("j2", 0) and line.queue == ("j2", "j3")
    line, none = cost.left(line, "j3")
    assert none is None and line.front == "j2" and line.queue == ("j2",)
    assert cost.left(line, "gone") == (line, None)


def test_the_front_after_a_stopped_one_carries_its_keys_estimate() -> None:
    line = KeyLine()
    for job in ("j1", "j2", "j3"):
        line, _ = cost.enter(line, job, virtual=0, advance=10)
    _, front = cost.left(line, "j1", advance=10)
    assert front is not None and (front.job, front.tag, front.advance) == ("j2", 0, 10)  # a pass plans j3 at 10


def test_a_pass_plans_each_keys_next_jobs_at_its_estimate() -> None:
    band = fair.score(3, 0)
    short = cost.Head(cost.rank(band + 100, parked=False), "s1", 1.0, advance=1_000, more=50)
    long = cost.Head(cost.rank(band + 0, parked=False), "l1", 0.0, advance=10_000, more=50)
    resubmit = cost.Head(cost.rank(1_700_000_000_000, parked=False), "r1", 9.0)
    planned = [(head.job, n) for head, n in cost.plan([short, long, resubmit], 14)]
    assert planned[:3] == [("r1", 0), ("l1", 0), ("s1", 0)]
    assert planned.count(("l1", 1)) == 1 and ("l1", 2) not in planned  # 10 s for one, 1 s for each short job
    assert [n for job, n in planned if job == "s1"] == list(range(11))
    parked = cost.Head(cost.rank(band + 5, parked=True), "p1", 0.0)
    assert [head.job for head, _ in cost.plan([parked, short], 3)] == ["s1", "s1", "s1"]  # fronts before parked
    alone = cost.Head(cost.rank(band + 0, parked=False), "n1", 0.0, advance=60_000, more=0)
    assert [head.job for head, _ in cost.plan([alone, long], 3)] == ["n1", "l1", "l1"]  # none past its key's queue


# the shares of Hermes time -------------------------------------------------------------------------------------------


def two_keys(mode: CostMode, long_weight: float, until_ms: int = 1_200 * S) -> dict[str, float]:
    line = CostLine(settings=CostSettings(mode), slots=10)
    jobs = backlog("long", 2_000, 10 * S, weight=long_weight) + backlog("short", 20_000, 1 * S)
    simulate(line, jobs, until_ms)
    return time_shares(line, ["long", "short"])


def test_two_backlogged_keys_of_10_s_and_1_s_runs_share_hermes_time_by_weight() -> None:
    # Given two keys with backlogs created at once, no history, 10 slots; runs of 10 s and 1 s
    even = two_keys(CostMode.TIME, 1.0)
    three = two_keys(CostMode.TIME, 3.0)
    jobs = two_keys(CostMode.RUNS, 1.0)
    print(f"\n10 s / 1 s, 10 slots, 20 min: weights 1:1 {even}; 3:1 {three}; counting jobs {jobs}")
    # Then each gets its weight's share of the Hermes time (counting jobs gives the long key 0.9)
    assert 0.45 <= even["long"] <= 0.55 and 0.45 <= even["short"] <= 0.55
    assert 0.70 <= three["long"] <= 0.80
    assert jobs["long"] > 0.85


def test_tokens_mode_shares_the_tokens_by_weight() -> None:
    line = CostLine(settings=CostSettings(CostMode.TOKENS, guess=50_000), slots=4)
    jobs = backlog("big", 2_000, 5 * S, tokens=100_000) + backlog("small", 20_000, 5 * S, tokens=10_000)
    simulate(line, jobs, 600 * S)
    used = cost_shares(line, ["big", "small"])
    print(f"\ntokens 100k / 10k per run, 4 slots, 10 min: {used}")
    assert 0.45 <= used["big"] <= 0.55


def lengths() -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, 10).map(lambda s: s * S), min_size=1, max_size=4)


def horizon(longest_ms: int, slots: int, least_share: float) -> int:
    """How long to run for a share within 10 % to be reachable: the runs in flight at the end and each key's last one
    (the divergence of fair queuing with slots: about a run per slot) stay within a twentieth of the smallest
    share."""
    return int(20 * longest_ms * (slots + 1) / slots / least_share)


@pytest.mark.timeout(300)  # simulations of up to ~30,000 jobs: 10-20 s here; the suite's 60 s would stop it mid-example
@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from([1.0, 2.0, 3.0]), lengths()), min_size=2, max_size=3),
    st.integers(1, 10),
    st.integers(1, 60).map(lambda s: s * S),
    st.sampled_from([1, 8, 64]),
)
def test_backlogged_keys_share_the_cost_of_the_runs_started_by_weight_for_any_mix_of_run_lengths(
    keys: list[tuple[float, list[int]]], slots: int, guess: int, partitions: int
) -> None:
    # Given keys with backlogs created at once (no history), each run's length from its key's mix, cycled
    line = CostLine(settings=CostSettings(CostMode.TIME, guess=guess), slots=slots, partitions=partitions)
    ideal = weight_shares({f"k{k}": weight for k, (weight, _) in enumerate(keys)})
    # (keys created together start an estimate apart: newcomers are paced as one key, so the horizon covers the guess)
    until = horizon(max(guess, *(length for _, mix in keys for length in mix)), slots, min(ideal.values()))
    jobs: list[Job] = []
    for k, (weight, mix) in enumerate(keys):
        count = int(until * slots * ideal[f"k{k}"] * 1.5) // min(mix) + 10
        runs = zip(range(count), itertools.cycle(mix), strict=False)
        jobs += [Job(f"k{k}-{i:06d}", f"k{k}", 0, length, 0, weight) for i, length in runs]
    simulate(line, jobs, until)
    # Then, while all stay backlogged, each key's share of the Hermes time of the runs started is its weight's share
    # within 10 %
    names = list(ideal)
    assert all(line.keys[(3, name)].queue for name in names)  # still backlogged at the end
    got = time_shares(line, names)
    for name in names:
        assert abs(got[name] - ideal[name]) <= 0.1 * ideal[name], (got, ideal)


# newcomers, idle keys ------------------------------------------------------------------------------------------------


@pytest.mark.timeout(300)  # simulations of up to ~30,000 jobs: 10-20 s here; the suite's 60 s would stop it mid-example
@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 20).map(lambda s: s * S),
    st.lists(st.integers(1, 40).map(lambda s: s * S), min_size=1, max_size=4),
    st.integers(1, 10),
    st.integers(1, 60).map(lambda s: s * S),
    st.sampled_from([0.5, 1.0, 2.0]),
)
def test_a_trickle_of_new_one_job_keys_at_the_grant_rate_never_pushes_a_backlogged_key_below_its_share(
    backlogged_ms: int, newcomer_ms: list[int], slots: int, guess: int, rate: float
) -> None:
    # Given key A's backlog, and new one-job keys arriving at about the rate slots free up (`rate` times it), their
    # runs of any length (also far past the guess: charged the guess at the grant, the rest at the settle)
    line = CostLine(settings=CostSettings(CostMode.TIME, guess=guess), slots=slots)
    mean = (backlogged_ms + sum(newcomer_ms) / len(newcomer_ms)) / 2
    gap = max(1, int(mean / slots / rate))
    horizon = (40 + 120 // slots) * max(backlogged_ms, *newcomer_ms)  # the guess is learnt for newcomers as well
    jobs = backlog("a", horizon * slots // backlogged_ms + 10, backlogged_ms)
    lengths = itertools.cycle(newcomer_ms)
    jobs += [Job(f"n{i:06d}", f"new-{i}", i * gap, next(lengths)) for i in range(horizon // gap)]
    simulate(line, jobs, horizon)
    # Then A keeps at least 0.4 of the Hermes time of the runs started (its weight's share against the newcomers,
    # paced as one key of weight 1), and its own jobs go in arrival order
    assert line.keys[(3, "a")].queue
    got = time_shares(line, ["a", *(f"new-{i}" for i in range(horizon // gap))])
    assert got["a"] >= 0.4, got["a"]
    mine = [start.job for start in line.starts if start.key == "a"]
    assert mine == sorted(mine)


@settings(max_examples=40, deadline=None)
@given(
    st.integers(1, 10).map(lambda s: s * S),
    st.integers(1, 10),
    st.integers(1, 600).map(lambda s: s * S),
    st.integers(0, 6),
)
def test_a_key_arriving_behind_a_backlog_charged_the_guess_starts_within_about_one_round(
    run_ms: int, slots: int, guess: int, runs_before: int
) -> None:
    # Given key A's backlog of short runs, its first ones charged the guess (up to 600 times what they take)
    line = CostLine(settings=CostSettings(CostMode.TIME, guess=guess), slots=slots)
    arrive = runs_before * run_ms + 1
    jobs = backlog("a", 40 * slots + 40, run_ms)
    # When key B arrives with a few jobs while every slot is busy
    jobs += [Job(f"b-{i}", "b", arrive, run_ms) for i in range(3)]
    simulate(line, jobs, arrive + 20 * run_ms)
    # Then B's first job is among the next starts (one round of the keys waiting: A's one job, give or take the
    # slot freeing at the same moment), not after A has used what its first runs were overcharged
    after = [start for start in line.starts if start.at_ms >= arrive]
    first = next(n for n, start in enumerate(after) if start.key == "b")
    assert first <= 2, [(start.key, start.at_ms) for start in after[: first + 1]]


@settings(max_examples=30, deadline=None)
@given(
    st.integers(1, 20).map(lambda s: s * S),
    st.integers(1, 20).map(lambda s: s * S),
    st.integers(60, 600).map(lambda s: s * S),
    st.integers(1, 10),
    st.sampled_from(WEIGHTS),
)
def test_a_key_back_from_idle_banks_nothing(
    idle_ms: int, busy_ms: int, away_ms: int, slots: int, weight: float
) -> None:
    # Given key I that ran a few jobs and went idle for `away_ms` while key B's backlog used every slot
    line = CostLine(settings=CostSettings(CostMode.TIME, guess=10 * S), slots=slots)
    back_at = away_ms + 2 * idle_ms
    horizon = back_at + 40 * max(idle_ms, busy_ms)
    jobs = [Job(f"i-{i:03d}", "idle", 0, idle_ms, 0, weight) for i in range(2)]
    jobs += backlog("busy", horizon * slots // busy_ms + 10, busy_ms)
    # When I comes back with a backlog
    jobs += [Job(f"j-{i:06d}", "idle", back_at, idle_ms, 0, weight) for i in range(horizon * slots // idle_ms + 10)]
    simulate(line, jobs, back_at)
    virtual = line.virtual[2]
    simulate(line, jobs, horizon)
    # Then it starts at the line's virtual time (not at its own old turn), and from then on gets its weight's
    # share, not a burst for the time it was away
    placed = line.keys[(3, "idle")]
    assert placed.queue
    first = next(start for start in line.starts if start.job == "j-000000")
    assert first.at_ms >= back_at
    got = time_shares(line, ["idle", "busy"], since_ms=back_at)
    share = weight / (weight + 1)
    assert got["idle"] <= share * 1.1 and got["idle"] >= share * 0.9, (got, share)
    assert virtual >= 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 30), st.integers(1, 20), st.booleans()), min_size=1, max_size=60),
    st.integers(1, 5),
    st.sampled_from(list(CostMode)),
)
def test_one_key_alone_is_plain_arrival_order(jobs: list[tuple[int, int, bool]], slots: int, mode: CostMode) -> None:
    # Given one key's jobs arriving over time, of any run length, some stopped while they wait
    line = CostLine(settings=CostSettings(mode, guess=5 * S), slots=slots)
    created = [
        Job(f"{i:04d}", "only", at * S, run * S, run, stop_ms=(at + 1) * S if stop else None)
        for i, (at, run, stop) in enumerate(jobs)
    ]
    simulate(line, created, 10**9)
    # Then its jobs start in arrival order, and every job not stopped starts
    order = [start.job for start in line.starts]
    assert order == sorted(order, key=lambda job: (jobs[int(job)][0], job))
    assert not line.waiting()


# priorities, resubmits, work conservation, crashes -------------------------------------------------------------------


@st.composite
def mixes(draw: st.DrawFn) -> list[Job]:
    count = draw(st.integers(1, 80))
    return [
        Job(
            f"{i:04d}",
            draw(st.sampled_from(["a", "b", "c"])),
            draw(st.integers(0, 40)) * S,
            draw(st.integers(1, 20)) * S,
            draw(st.integers(1, 5)) * 1_000,
            draw(st.sampled_from(WEIGHTS)),
            draw(st.sampled_from([1, 3, 5])),
            draw(st.one_of(st.none(), st.integers(1, 10).map(lambda s: s * S))),
            draw(st.one_of(st.none(), st.integers(0, 60).map(lambda s: s * S))),
        )
        for i in range(count)
    ]


@settings(max_examples=80, deadline=None)
@given(mixes(), st.integers(1, 6), st.sampled_from(list(CostMode)), st.sets(st.integers(0, 79), max_size=10))
def test_strict_priority_resubmits_first_fifo_within_a_key_and_nothing_idles_for_fairness(
    jobs: list[Job], slots: int, mode: CostMode, crashing: set[int]
) -> None:
    # Given jobs of several keys, weights and priorities arriving over time, some interrupted (resubmitted), some
    # stopped while they wait, and replicas that die between a grant's claim and its key's step
    line = CostLine(
        settings=CostSettings(mode, guess=5 * S),
        slots=slots,
        record=True,
        crashes=lambda job_id: int(job_id) in crashing,
    )
    simulate(line, jobs, 10**9)
    by_id = {job.id: job for job in jobs}
    first = {start.job: start for start in line.starts if start.attempt == 1}
    # Then every job not stopped runs, its first attempt once
    stopped = {job.id for job in jobs if job.id not in first}
    assert all(by_id[job_id].stop_ms is not None for job_id in stopped)
    assert len(first) == len([start for start in line.starts if start.attempt == 1])
    assert not line.waiting() and not line.live and not line.charges
    for when, granted, waiting, free in line.passes:
        # nothing idles for fairness: a pass leaves no slot free while a job waits
        assert not (waiting and free), (when, waiting, free)
        firsts = [by_id[j] for j in granted if j in first and first[j].at_ms == when]
        waiting_firsts = [by_id[j] for j in waiting if j not in first or first[j].at_ms > when]
        resubmits_waiting = [j for j in waiting if j in first and first[j].at_ms < when]
        # strict priority: no first attempt granted while one of a smaller priority number waits
        if firsts and waiting_firsts:
            assert max(job.priority for job in firsts) <= min(job.priority for job in waiting_firsts)
        # resubmits first: no first attempt granted while a resubmit waits
        assert not (firsts and resubmits_waiting)
    # FIFO within a priority and key
    for priority, key in itertools.product((1, 3, 5), ("a", "b", "c")):
        mine = [start.job for start in line.starts if start.attempt == 1 and by_id[start.job].key == key]
        mine = [job for job in mine if by_id[job].priority == priority]
        assert mine == sorted(mine, key=lambda job: (by_id[job].arrive_ms, job))
