"""The bounded line's part of the job write (SPEC S4.4): the `bound` field names exactly the KEYS that follow."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.admission.quotas import Bound
from broker.store import bound, keys

bounds = st.builds(Bound, key=st.integers(0, 9), all=st.integers(0, 9)).filter(bool)


@given(bounds, st.integers(1, 40), st.booleans(), st.integers(0, 5), st.integers(0, 5))
def test_the_field_names_the_keys_that_follow(limit: Bound, first: int, cluster: bool, mine: int, all_: int) -> None:
    job_id = "job_" + "c" * 32
    partitions = bound.seen(cluster, job_id)
    written = bound.fields(limit, "team-a", first, partitions, (mine, all_))
    script_keys = ["x"] * (first - 1) + bound.script_keys(limit, partitions)
    assert written["name"] == "team-a"
    for scope, most, base, named in (("key", limit.key, mine, keys.fair), ("all", limit.all, all_, keys.line)):
        if not most:
            assert scope not in written
            continue
        part = written[scope]
        assert isinstance(part, dict) and (part["most"], part["base"]) == (most, base)
        assert script_keys[part["first"] - 1 : part["last"]] == [named(p) for p in partitions]


def test_a_single_redis_counts_every_partition_and_a_cluster_the_jobs_own() -> None:
    job_id = "job_" + "c" * 32
    assert bound.seen(False, job_id) == list(keys.partitions())
    assert bound.seen(True, job_id) == [keys.partition_of(job_id)]
