"""The fair line's ordering (SPEC S4.2), pure: tag arithmetic, scheduling defaults, and properties of the partitioned
line as the store keeps it (broker/admission/fair.py `FairLine`: turns per key, V per priority, partition lines
merged by the passes)."""

from __future__ import annotations

import math

from attrs import evolve
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.admission import fair
from broker.admission.fair import FairLine, FairnessSettings, SchedulingRequest, resolve
from broker.events import Scheduling

KEYS = ["", "a", "b", "c", "d"]
WEIGHTS = [0.25, 0.5, 1.0, 2.0, 3.0, 10.0]


@st.composite
def arrivals(
    draw: st.DrawFn, keys: list[str] = KEYS, priorities: tuple[int, ...] = fair.PRIORITIES
) -> list[Scheduling]:
    return draw(
        st.lists(
            st.builds(
                Scheduling,
                priority=st.sampled_from(priorities),
                fairness_key=st.sampled_from(keys),
                fairness_weight=st.sampled_from(WEIGHTS),
            ),
            min_size=1,
            max_size=60,
        )
    )


Pass = tuple[list[str], set[str]]  #: (taken by the pass, still waiting after it)


def job_id(index: int) -> str:
    """Ids that do not sort in arrival order (equal scores sort by id, as in Redis)."""
    return f"{(index * 2_654_435_761) % 2**32:010d}"


def arrival(order: list[str]) -> list[int]:
    index = {job_id(i): i for i in range(1_000)}
    return [index[j] for j in order]


def run(
    jobs: list[Scheduling], passes: list[int], *, entered_per_pass: int = 1_000, partitions: int = 8
) -> tuple[list[str], dict[str, Scheduling], list[Pass]]:
    """Enter `jobs` (id = its arrival index) `entered_per_pass` at a time between passes of the given sizes, until all
    are taken; (the order taken, id -> scheduling, every pass)."""
    line = FairLine(partitions=partitions)
    entered: dict[str, Scheduling] = {}
    order: list[str] = []
    history: list[Pass] = []
    index, turn = 0, 0
    while index < len(jobs) or line.waiting():
        for scheduling in jobs[index : index + entered_per_pass]:
            line.enter(job_id(index), scheduling, index * 7919)
            entered[job_id(index)] = scheduling
            index += 1
        taken = line.take(passes[turn % len(passes)])
        order += taken
        history.append((taken, set(entered) - set(order)))
        turn += 1
    return order, entered, history


def test_advance_is_a_thousandth_of_a_turn_per_unit_of_weight_and_clamped() -> None:
    assert fair.advance(1.0) == 10_000 and fair.advance(3.0) == 3_333 and fair.advance(2.0 / 3) == 15_000
    assert fair.advance(1_000.0) == 10 and fair.advance(700.0) == 14  # the heaviest weights are still told apart
    assert fair.advance(1e-12) == fair.MAX_ADVANCE and fair.advance(1e-300) == fair.MAX_ADVANCE


def test_a_start_tag_is_the_later_of_the_keys_turn_and_the_virtual_time_and_saturates_in_its_band() -> None:
    assert fair.start(None, 50_000, 10_000) == (50_000, 60_000)
    assert fair.start(90_000, 50_000, 5_000) == (90_000, 95_000)
    assert fair.start(fair.MAX_TAG - 1, 0, 10_000) == (fair.MAX_TAG - 1, fair.MAX_TAG)


@given(st.sampled_from(fair.PRIORITIES), st.integers(0, fair.MAX_TAG))
def test_a_score_says_its_priority_and_tag_and_sorts_by_priority_first(priority: int, tag: int) -> None:
    place = fair.score(priority, tag)
    assert fair.band_of(float(place)) == (priority, tag)  # exact as a double (below 2**53)
    assert float(place) == place
    assert fair.score(priority, fair.MAX_TAG) < fair.front(priority + 1) if priority < 5 else True
    legacy_first_attempt, resubmit = 1_796_005_747_391 * 1000, 1_796_005_747_391
    assert resubmit < legacy_first_attempt < fair.front(1) <= place
    assert fair.band_of(legacy_first_attempt) is None


@given(
    st.lists(
        st.one_of(
            st.builds(fair.score, st.sampled_from(fair.PRIORITIES), st.integers(0, fair.MAX_TAG)),
            st.integers(0, fair.BASE - 1),  # resubmits and the places an older broker gave
        ),
        max_size=20,
    ),
    st.sampled_from(fair.PRIORITIES),
)
def test_the_smallest_tag_of_a_priority_is_the_least_tag_its_bands_places_say(places: list[int], priority: int) -> None:
    bands = [fair.band_of(float(place)) for place in places]
    tags = [found[1] for found in bands if found is not None and found[0] == priority]
    assert fair.smallest(map(float, places), priority) == min(tags, default=None)


def test_defaults_come_from_the_configured_source_and_configured_weights_win() -> None:
    plain = SchedulingRequest()
    by_key = FairnessSettings()
    default = Scheduling(multitask="enqueue")  # RUNS_SESSION_MULTITASK's default (SPEC S4.3)
    assert resolve(plain, session_key="u1", session_id="s1", settings=by_key) == evolve(default, fairness_key="u1")
    assert resolve(plain, session_key=None, session_id="s1", settings=by_key) == default
    by_id = FairnessSettings(default="session_id")
    assert resolve(plain, session_key="u1", session_id="s1", settings=by_id).fairness_key == "s1"
    assert resolve(plain, session_key="u1", session_id="s1", settings=FairnessSettings(default="none")) == default
    assert resolve(plain, session_key=None, session_id="s1", settings=FairnessSettings(multitask="reject")) == evolve(
        default, multitask="reject"
    )
    named = SchedulingRequest(priority=1, fairness_key="team", fairness_weight=5, multitask="parallel")
    wanted = Scheduling(priority=1, fairness_key="team", fairness_weight=5.0, multitask="parallel")
    assert resolve(named, session_key="u1", session_id=None, settings=by_key) == wanted
    weighted = FairnessSettings(weights={"team": 2.0, "u1": 0.5})
    assert resolve(named, session_key=None, session_id=None, settings=weighted).fairness_weight == 2.0
    assert resolve(plain, session_key="u1", session_id=None, settings=weighted).fairness_weight == 0.5


@settings(max_examples=150, deadline=None)
@given(arrivals(), st.lists(st.integers(1, 5), min_size=1, max_size=5), st.integers(1, 8))
def test_strict_priority_and_fifo_within_a_key(jobs: list[Scheduling], passes: list[int], per_pass: int) -> None:
    order, entered, history = run(jobs, passes, entered_per_pass=per_pass)
    assert sorted(order) == sorted(entered)  # every job is taken once
    # within one priority and key: arrival order (a key of several priorities: per priority)
    for priority in fair.PRIORITIES:
        for key in KEYS:
            mine = arrival([j for j in order if entered[j].priority == priority and entered[j].fairness_key == key])
            assert mine == sorted(mine)
    # strict priority: no pass takes a job while one of a smaller priority number stays waiting
    for taken, waiting in history:
        if taken and waiting:
            assert max(entered[j].priority for j in taken) <= min(entered[j].priority for j in waiting)


@settings(max_examples=100, deadline=None)
@given(arrivals(keys=["only"], priorities=(3,)), st.lists(st.integers(1, 5), min_size=1, max_size=5), st.integers(1, 8))
def test_one_key_is_plain_arrival_order(jobs: list[Scheduling], passes: list[int], per_pass: int) -> None:
    order, _, _ = run(jobs, passes, entered_per_pass=per_pass)
    assert arrival(order) == list(range(len(jobs)))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(WEIGHTS), min_size=2, max_size=4), st.integers(20, 120))
def test_backlogged_keys_share_in_proportion_to_their_weights(weights: list[float], taken: int) -> None:
    # Given keys with many more waiting jobs each than are taken, all of one priority
    line = FairLine(partitions=8)
    for round_ in range(200):
        for k, weight in enumerate(weights):
            line.enter(f"{k}:{round_:04d}", Scheduling(fairness_key=f"k{k}", fairness_weight=weight), round_ * 31 + k)
    # When `taken` jobs are granted, in passes of 3
    order: list[str] = []
    while len(order) < taken:
        order += line.take(3)
    order = order[:taken]
    # Then each key's count is its weight's share, within one job per key (and the advance's rounding)
    total = sum(1 / fair.advance(w) for w in weights)
    for k, weight in enumerate(weights):
        ideal = taken * (1 / fair.advance(weight)) / total
        assert abs(sum(j.startswith(f"{k}:") for j in order) - ideal) <= len(weights), (k, weight, order)
        assert math.isclose(1 / fair.advance(weight), weight / fair.UNIT, rel_tol=0.01)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 200), st.integers(1, 10), st.sampled_from(WEIGHTS))
def test_a_late_key_starts_within_about_one_round_of_the_waiting_keys(backlog: int, taken: int, weight: float) -> None:
    # Given key A's backlog of `backlog` jobs of which `taken` ran
    line = FairLine(partitions=8)
    for i in range(backlog):
        line.enter(f"a{i:04d}", Scheduling(fairness_key="a"), i)
    order = line.take(taken)
    # When key B arrives with 3 jobs, Then its first one is among the next 2 grants (after A's head, which arrived
    # first) and B is done within 3 of its rounds (A runs one job per turn, B one per advance)
    for i in range(3):
        line.enter(f"b{i}", Scheduling(fairness_key="b", fairness_weight=weight), 1_000 + i)
    order = []
    while line.waiting():
        order += line.take(1)
    b_at = [order.index(f"b{i}") for i in range(3)]
    assert b_at[0] <= 1
    assert b_at[2] <= 2 * math.ceil(fair.advance(weight) / fair.UNIT) + 3 + 1


@settings(max_examples=100, deadline=None)
@given(arrivals(keys=["a", "b", "c"], priorities=(2,)), st.integers(0, 3_000))
def test_a_stale_virtual_time_keeps_fifo_within_a_key_and_only_moves_newcomers_ahead(
    jobs: list[Scheduling], lag: int
) -> None:
    # Given creates on a replica whose V lags the line's by `lag` tag units
    line = FairLine(partitions=4)
    taken: list[str] = []
    for index, scheduling in enumerate(jobs):
        stale = max(0, line.virtual[1] - lag)
        line.enter(job_id(index), scheduling, index, virtual=stale)
        if index % 3 == 2:
            taken += line.take(2)
    while line.waiting():
        taken += line.take(2)
    # Then each key still goes in arrival order
    for key in ("a", "b", "c"):
        mine = [i for i in arrival(taken) if jobs[i].fairness_key == key]
        assert mine == sorted(mine)


def test_top_keys_sum_partitions_and_rank_by_waiting_jobs() -> None:
    loads = fair.top_keys([("a", 2, 1.0), ("b", 5, 3.0), ("a", 4, 1.0), ("c", 1, 1.0), ("d", 0, 1.0)], most=2)
    assert loads == [fair.KeyLoad("a", 6, 1.0), fair.KeyLoad("b", 5, 3.0)]


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(2, 6), st.integers(1, 3))
def test_a_stream_of_one_job_keys_starves_nobody(seed: int, arriving: int, served: int) -> None:
    # Given more one-job keys arriving between passes than the passes take (an overloaded line)
    line = FairLine(partitions=8)
    waited: dict[str, tuple[int, int]] = {}  # job -> (arrival pass, place)
    taken: list[str] = []
    first_taken: dict[int, int] = {}  # place -> the pass its first job was taken in
    for turn in range(60):
        for n in range(arriving):
            job = f"{(seed + turn * 7 + n * 13) * 2_654_435_761 % 2**32:010d}-{turn:03d}-{n}"
            waited[job] = (turn, line.enter(job, Scheduling(fairness_key=job), turn + n))
        for job in line.take(served):
            first_taken.setdefault(waited[job][1], turn)
            taken.append(job)
    # Then places never decrease with arrival, so a job is overtaken only by jobs of its own place, which all
    # arrived before the first of them was taken: once its place is being served, every later arrival waits
    places = [place for _, place in sorted(waited.values())]
    assert places == sorted(places)
    for position, job in enumerate(taken):
        for later in taken[position + 1 :]:
            if waited[later][0] < waited[job][0]:  # `later` arrived first but went after `job`
                assert waited[later][1] == waited[job][1]
                assert waited[job][0] <= first_taken[waited[job][1]]


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 60), st.integers(1, 7))
def test_one_job_keys_that_tie_go_in_arrival_order(count: int, most: int) -> None:
    # Given a burst of one-job keys created between two grants (one tag), several in a partition
    line = FairLine(partitions=8)
    for index in range(count):
        line.enter(job_id(index), Scheduling(fairness_key=f"user-{index}"), index * 7_919)
    # When passes take them, Then they go in arrival order, not by job id
    order: list[str] = []
    while line.waiting():
        order += line.take(most)
    assert arrival(order) == list(range(count))


def test_ties_are_reordered_only_among_the_heads_a_pass_reaches() -> None:
    merged = [(1.0, "b", 0), (1.0, "a", 1), (2.0, "c", 2), (3.0, "d", 3)]
    assert fair.tied_at_cut(merged, 1) == fair.tied_at_cut(merged, 3) == merged[:2]
    assert fair.tied_at_cut(merged[1:], 3) == []
    assert fair.by_arrival(merged, {"b": 5.0, "a": None}) == merged  # an unknown arrival goes last
    assert fair.by_arrival(merged, {"b": 5.0, "a": 4.0}) == [merged[1], merged[0], *merged[2:]]


@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(WEIGHTS),
    st.integers(1, 3),
    st.lists(st.integers(0, 3), min_size=30, max_size=120),
    st.integers(1, 8),
)
def test_a_backlogged_key_keeps_its_weights_share_against_any_stream_of_new_one_job_keys(
    weight: float, most: int, arriving: list[int], partitions: int
) -> None:
    # Given key A's backlog, and between passes of `most` grants up to `most` new one-job keys (the grant rate)
    line = FairLine(partitions=partitions)
    for i in range(400):
        line.enter(f"a{i:04d}", Scheduling(fairness_key="a", fairness_weight=weight), i * 7)
    taken: list[str] = []
    for turn, count in enumerate(arriving):
        for n in range(min(count, most)):
            line.enter(f"n{turn:03d}-{n}", Scheduling(fairness_key=f"new-{turn}-{n}"), turn * 31 + n)
        taken += line.take(most)
    # Then A keeps at least its weight's share of the grants against the newcomers (weight 1 each, as one key), within
    # a few jobs, and its own jobs go in arrival order
    mine = [job for job in taken if job.startswith("a")]
    share = weight / (weight + 1)
    assert len(mine) >= share * len(taken) - 2 * most - 1, (len(mine), len(taken))
    assert mine == sorted(mine)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 20), st.integers(0, 60), st.sampled_from(WEIGHTS), st.integers(1, 3))
def test_a_key_back_from_idle_banks_nothing(used: int, busy: int, weight: float, most: int) -> None:
    # Given key I that ran `used` jobs and went idle, while key B's backlog ran on for `busy` grants
    line = FairLine(partitions=8)
    for i in range(used):
        line.enter(f"i{i:03d}", Scheduling(fairness_key="idle", fairness_weight=weight), i)
    for i in range(500):
        line.enter(f"b{i:03d}", Scheduling(fairness_key="busy"), 100 + i)
    while any(job.startswith("i") for line_ in line.lines.values() for _, job in line_):
        line.take(most)
    for _ in range(busy):
        line.take(most)
    # When I comes back together with a key never seen
    back = line.enter("i-back", Scheduling(fairness_key="idle", fairness_weight=weight), 1_000)
    fresh = line.enter("f-new", Scheduling(fairness_key="fresh", fairness_weight=weight), 1_001)
    # Then I starts no earlier than a new key (later while its last turn is still ahead of V), and not ahead of the
    # jobs waiting when it came back
    assert back >= fresh
    waiting = min(place for line_ in line.lines.values() for place, job in line_ if job.startswith("b"))
    assert back >= waiting


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 80), st.integers(1, 3), st.integers(0, 20))
def test_a_burst_of_new_keys_leaves_the_next_newcomer_no_debt(burst: int, most: int, before: int) -> None:
    # Given two backlogged keys, and a burst of one-job keys arriving together after `before` passes
    line = FairLine(partitions=8)
    for i in range(600):
        line.enter(f"{'ab'[i % 2]}{i:04d}", Scheduling(fairness_key="ab"[i % 2]), i)
    for _ in range(before):
        line.take(most)
    for n in range(burst):
        line.enter(f"n{n:03d}", Scheduling(fairness_key=f"new-{n}"), 1_000 + n)
    while any(job.startswith("n") for line_ in line.lines.values() for _, job in line_):
        line.take(most)
    # When one more new key arrives once the burst ran, Then it starts within about a round of the two keys
    line.enter("late", Scheduling(fairness_key="late"), 5_000)
    order: list[str] = []
    while "late" not in order:
        order += line.take(most)
    assert order.index("late") <= 2 * (2 + 1) * most, order
