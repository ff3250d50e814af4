"""What a replica knows of the lines between reads (broker/admission/heads.py): a pass that reads only the lines
known to have changed, and reads again the line of a known head that is gone, grants exactly what a pass that read
every line would, whatever other replicas take unannounced and whatever joins announced."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.admission.heads import DEPTH, KnownHeads

PARTITIONS = 4

joins = st.tuples(st.just("join"), st.integers(0, PARTITIONS - 1), st.integers(0, 40))
takes = st.tuples(st.just("other takes"), st.integers(0, PARTITIONS - 1), st.integers(0, 3))
passes = st.tuples(st.just("pass"), st.integers(1, 2 * DEPTH), st.just(0))


def first(lines: dict[int, list[tuple[str, float]]], most: int) -> list[str]:
    return [job for _, job, _ in sorted((s, j, p) for p, line in lines.items() for j, s in line)[:most]]


def a_pass(known: KnownHeads, lines: dict[int, list[tuple[str, float]]], most: int) -> list[str]:
    """admission.py's pass over `lines`: read what changed, claim the merged heads, read again where one was gone."""
    taken: list[str] = []
    while len(taken) < most:
        wanted = most - len(taken)
        read = known.to_read(wanted)
        known.reading(read)
        depth = max(wanted, DEPTH)
        for partition in read:
            known.read(partition, sorted(lines[partition], key=lambda e: (e[1], e[0]))[:depth], depth)
        heads = known.merged(wanted)[:wanted]
        if not heads:
            break
        lost = False
        for _, job_id, partition in heads:
            if any(job == job_id for job, _ in lines[partition]):
                lines[partition] = [entry for entry in lines[partition] if entry[0] != job_id]
                known.taken(job_id, partition, gone=False)
                taken.append(job_id)
            else:
                known.taken(job_id, partition, gone=True)
                lost = True
        if not lost:
            break
    return taken


@given(st.lists(st.one_of(joins, takes, passes), max_size=80))
def test_a_pass_grants_the_first_jobs_of_every_line(steps: list[tuple[str, int, int]]) -> None:
    known = KnownHeads()
    lines: dict[int, list[tuple[str, float]]] = {p: [] for p in range(PARTITIONS)}
    for p in range(PARTITIONS):
        known.changed(p)  # never read: as a full read does first
    serial = 0
    for step, arg, value in steps:
        if step == "join":  # a create's write, announced (`line J`)
            serial += 1
            lines[arg].append((f"job-{serial:04d}", float(value)))
            known.changed(arg)
        elif step == "other takes":  # another replica claims heads of a line: no message
            line = sorted(lines[arg], key=lambda e: (e[1], e[0]))
            lines[arg] = line[value:]
        else:
            expected = first(lines, arg)
            assert a_pass(known, lines, arg) == expected
    assert known.any_waiting() or not any(lines.values())


def test_merged_heads_stop_past_the_cut_once_the_cut_score_is_over() -> None:
    known = KnownHeads()
    known.read(0, [("a", 1.0), ("b", 2.0), ("c", 2.0)], DEPTH)
    known.read(1, [("d", 2.0), ("e", 3.0)], DEPTH)
    known.read(2, [], DEPTH)
    # two heads for a pass of one (the one it grants and the first it leaves), then the rest of their score
    assert known.merged(1) == [(1.0, "a", 0), (2.0, "b", 0), (2.0, "c", 0), (2.0, "d", 1)]
    assert known.merged(0) == [(1.0, "a", 0)]
    assert [job for _, job, _ in known.merged(10)] == ["a", "b", "c", "d", "e"]
