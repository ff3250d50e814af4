"""The memory guard's rule (SPEC S4.4): a node refuses new jobs once what it holds and owes passes its mark."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.jobs.room import JOB_BYTES, NOTHING, RESERVE_BYTES, Since, cost, headroom, need, past_mark
from broker.store.memory import NodeMemory

MB = 1024 * 1024
nodes = st.builds(
    NodeMemory,
    node=st.sampled_from(["a:1", "b:2", "c:3"]),
    used=st.integers(0, 100 * MB),
    maxmemory=st.integers(0, 100 * MB),
    unfinished=st.integers(0, 10_000),
)
shares = st.floats(0.01, 1.0)


def test_a_node_below_its_mark_with_room_for_its_unfinished_jobs_takes_jobs() -> None:
    node = NodeMemory("redis", used=40 * MB, maxmemory=50 * MB, unfinished=100)
    assert past_mark([node], 0.9) is None
    assert past_mark([node], 0.9, Since(bytes=5 * MB, jobs=0)) == node


def test_unfinished_jobs_keep_their_reserve() -> None:
    # 40 MB used and 1,500 jobs that still write: 40 MB + 1,500 x 4 KB > 45 MB
    node = NodeMemory("redis", used=40 * MB, maxmemory=50 * MB, unfinished=1_500)
    assert past_mark([node], 0.9) == node


def test_a_node_without_maxmemory_has_no_mark() -> None:
    assert past_mark([NodeMemory("redis", used=10**12, maxmemory=0, unfinished=10**6)], 0.1) is None


def test_the_fullest_node_is_named() -> None:
    a = NodeMemory("a:1", used=46 * MB, maxmemory=50 * MB)
    b = NodeMemory("b:2", used=49 * MB, maxmemory=50 * MB)
    assert past_mark([a, b, NodeMemory("c:3", used=0, maxmemory=50 * MB)], 0.9) == b


def test_a_job_counts_its_body_its_keys_and_its_reserve() -> None:
    since = NOTHING.plus(3_000).plus(1_000)
    assert since == Since(bytes=4_000 + 2 * JOB_BYTES, jobs=2)
    assert need(NodeMemory("redis", 100, 1_000, unfinished=1), since) == 100 + since.bytes + 3 * RESERVE_BYTES


@given(st.lists(nodes, max_size=4), shares, st.integers(0, 10 * MB), st.integers(0, 1_000))
def test_more_written_since_the_reading_never_makes_room(
    readings: list[NodeMemory], high: float, extra: int, jobs: int
) -> None:
    if past_mark(readings, high) is not None:
        assert past_mark(readings, high, Since(extra, jobs)) is not None


@given(st.lists(nodes, max_size=4), shares)
def test_a_node_past_its_mark_is_one_with_a_maxmemory_past_it(readings: list[NodeMemory], high: float) -> None:
    full = past_mark(readings, high)
    assert full is None or (full in readings and full.maxmemory > 0 and need(full, NOTHING) > high * full.maxmemory)
    if full is None:
        assert all(not node.maxmemory or need(node, NOTHING) <= high * node.maxmemory for node in readings)


@given(st.lists(nodes, max_size=3), st.integers(0, 20_000), st.integers(0, 10 * MB), shares)
def test_below_the_headroom_no_node_is_past_its_mark(
    readings: list[NodeMemory], jobs: int, added: int, high: float
) -> None:
    # the creates' fast check (MemoryWatch.admit) admits only what past_mark admits, and sees every node with a mark
    since = Since(bytes=added + jobs * JOB_BYTES, jobs=jobs)
    room = headroom(readings, high)
    if room is None:
        assert all(node.maxmemory == 0 for node in readings) and past_mark(readings, high, since) is None
    elif cost(since) < room - 1:
        assert past_mark(readings, high, since) is None
    elif cost(since) > room + 1:
        assert past_mark(readings, high, since) is not None
