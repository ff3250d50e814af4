"""usage_record.lua against a real Redis: a batch's facts are counted once each, one write per fairness key."""

from __future__ import annotations

from redis.asyncio import Redis

from broker.store import keys
from broker.store.usage import UsageStore, hour_of
from projections.usage import Used
from tests.conftest import BOTH_BACKENDS

pytestmark = BOTH_BACKENDS

T0 = 1_796_005_747_391
HOUR = hour_of(T0)
RETENTION_MS = 10 * 365 * 86_400_000  #: the hour T0 falls in is kept whenever the tests run


def _fact(job: int, key: str, *, end: bool) -> Used:
    if end:
        return Used(marker=f"job_{job}:end", key=key, at_ms=T0, runs_completed=1, hermes_ms=1_000 + job,
                    input_tokens=10, output_tokens=5, total_tokens=15)  # fmt: skip
    return Used(marker=f"job_{job}:1:a", key=key, at_ms=T0, runs_started=1)


async def _calls(redis: Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


async def test_a_batch_counts_each_fact_once_and_writes_each_key_once(redis: Redis, backend: str) -> None:
    store = UsageStore(redis, retention_ms=RETENTION_MS)
    # Given an hour that counted one fact of key a already
    assert await store.count([_fact(0, "a", end=False)]) == [True]
    # When a batch of 12 facts of two keys (one of them the fact counted before) is counted
    batch = [_fact(job, "a" if job % 3 else "b", end=end) for job in range(6) for end in (False, True)]
    if backend == "single":
        await redis.config_resetstat()
    counted = await store.count(batch)
    # Then every fact but the one seen before is counted (job 0's start: under key a, not b), and each key's counters
    # are the sum of its facts
    assert counted == [index != 0 for index in range(12)]
    [hour] = await store.hours([HOUR])
    a_jobs, b_jobs = [1, 2, 4, 5], [0, 3]
    assert hour["a"] == (5, 4, 0, 0, sum(1_000 + job for job in a_jobs), 40, 20, 60)
    assert hour["b"] == (1, 2, 0, 0, sum(1_000 + job for job in b_jobs), 20, 10, 30)
    assert await store.ranked([HOUR]) == {"a": 4_012, "b": 2_003}
    # And (one Redis: its INFO commandstats) a marker per fact, but one read and one write of each key's counters
    if backend == "single":
        calls = await _calls(redis)
        assert (calls["sadd"], calls["hget"], calls["hset"], calls["zincrby"]) == (12, 2, 2, 2)
    assert await redis.scard(keys.usage(HOUR).seen) == 12  # job 0's start once


async def test_a_key_without_hermes_time_still_enters_the_hours_ranking(redis: Redis) -> None:
    store = UsageStore(redis, retention_ms=RETENTION_MS)
    # When an hour counts only a start of key a (no Hermes ms yet)
    assert await store.count([_fact(7, "a", end=False)]) == [True]
    # Then the key is ranked, with 0 ms, as a fact at a time did
    assert await store.ranked([HOUR]) == {"a": 0}


async def test_a_key_whose_counters_an_older_version_wrote_adds_to_them(redis: Redis) -> None:
    store = UsageStore(redis, retention_ms=RETENTION_MS)
    # Given counters of key a written before (the stored format: eight comma-joined integers)
    await redis.hset(keys.usage(HOUR).counters, "a", "1,1,0,0,500,1,2,3")
    # When two facts of key a are counted in one call
    assert await store.count([_fact(1, "a", end=False), _fact(1, "a", end=True)]) == [True, True]
    # Then they add to them
    [hour] = await store.hours([HOUR])
    assert hour["a"] == (2, 2, 0, 0, 1_501, 11, 7, 18)
