"""The callback schedule (SPEC S5.8): a sender claims at most as many due deliveries as it has places for, the
soonest due first across every partition, and leaves the rest due for any sender."""

from __future__ import annotations

from redis.asyncio import Redis

from broker.store import keys
from broker.store.callbacks import CallbackStore
from tests.conftest import BOTH_BACKENDS

NOW = 1_800_000_000_000
LEASE = 12_000


@BOTH_BACKENDS
async def test_a_claim_takes_at_most_its_limit_in_all_soonest_first(redis: Redis) -> None:
    # Given three due jobs in each partition, one of them owed long before all the others
    due: dict[str, int] = {}
    for partition in keys.partitions():
        for n in range(3):
            job_id = f"job_{partition:02d}{n}"
            due[job_id] = NOW - 1_000 - n - (500_000 if (partition, n) == (40, 2) else 0)
            await redis.zadd(keys.callbacks_due(partition), {job_id: due[job_id]})
    # When a sender with five free places claims
    claimed = await CallbackStore(redis).claim(NOW, LEASE, 5)
    # Then it took five: the oldest first, then the next soonest
    assert len(claimed) == 5, len(claimed)
    assert claimed[0] == "job_402"
    assert sorted(due[job] for job in claimed) == sorted(due.values())[:5]
    # and only those are claimed: every other job is still due as it was
    for partition in keys.partitions():
        for job_id, score in await redis.zrange(keys.callbacks_due(partition), 0, -1, withscores=True):
            assert score == (NOW + LEASE if job_id in claimed else due[job_id]), job_id
