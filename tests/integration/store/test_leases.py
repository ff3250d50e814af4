"""A replica renews all its run leases in one pipeline (broker/store/leases.py), on a single Redis and on
the cluster: held leases are renewed with their takeover deadlines, a lease another holder took is not."""

from __future__ import annotations

from redis.asyncio import Redis

from broker.ids import new_job_id
from broker.store import keys
from broker.store.leases import Leases
from tests.conftest import BOTH_BACKENDS

pytestmark = BOTH_BACKENDS


async def test_renewing_every_lease_at_once_keeps_the_held_ones_and_reports_the_lost(redis: Redis) -> None:
    leases = Leases(redis, lease_ms=1_000)
    jobs = [new_job_id() for _ in range(20)]  # spread over many partitions
    for job_id in jobs:
        assert await leases.acquire(job_id, f"token-{job_id}", 1_000)
    stolen = jobs[3]
    await redis.set(keys.lease(stolen), "another-replica", px=60_000)

    held = await leases.renew_many([(job_id, f"token-{job_id}") for job_id in jobs], 50_000)

    assert held == [job_id != stolen for job_id in jobs]
    for job_id in jobs:
        due = await redis.zscore(keys.due(keys.partition_of(job_id)), job_id)
        assert due == (51_000 if job_id != stolen else 2_000)  # renewed: due when the new lease would lapse
    assert await redis.get(keys.lease(stolen)) == "another-replica"
    assert await leases.renew_many([], 50_000) == []
