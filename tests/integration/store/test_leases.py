"""A replica renews all its run leases in one pipeline (broker/store/leases.py), on a single Redis and on
the cluster: held leases are renewed with their takeover deadlines, a lease another holder took is not."""

from __future__ import annotations

from redis.asyncio import Redis

from broker.events import JobCreated, JobEvent, JobFinished, JobStatus, RunAccepted
from broker.ids import new_job_id
from broker.store import keys
from broker.store.jobs import JobStore
from broker.store.leases import Leases
from projections.job import JobView, fold
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


async def test_the_drivers_terminal_write_releases_its_lease_and_the_owner_release_is_free(redis: Redis) -> None:
    job = "job_11111111111111111111111111111111"
    created = JobCreated(job_id=job, at_ms=1_000, body='{"input":"x"}', fingerprint="f" * 64, idempotency_key="k")
    store, leases = JobStore(redis, retention_ms=60_000), Leases(redis, lease_ms=1_000)
    last = (await store.create(created, _fold(created))).snapshot.last_id
    assert await leases.acquire(job, "token-a", 2_000)
    accepted = RunAccepted(job_id=job, at_ms=2_001, attempt=1, hermes_run_id="run_1")
    last = (
        await store.append(job, [accepted], _fold(created, accepted), expected_last_id=last, lease_token="token-a")
    )[-1]
    assert await redis.get(keys.lease(job)) == "token-a"  # a write that does not end the job keeps it
    done = JobFinished(job_id=job, at_ms=2_002, status=JobStatus.COMPLETED, attempt=1, output="o")
    view = _fold(created, accepted, done)

    await store.append(job, [done], view, expected_last_id=last, lease_token="token-a", release=True)
    leases.released(job, "token-a")

    assert await redis.exists(keys.lease(job)) == 0
    assert await redis.zscore(keys.due(keys.partition_of(job)), job) is None
    assert await leases.renew_many([(job, "token-a")], 3_000) == [True]  # its runner is finishing: not lost
    assert await redis.exists(keys.lease(job)) == 0
    assert await leases.release(job, "token-a", due_at_ms=None)
    assert not await leases.release(job, "token-a", due_at_ms=None)  # once: then it is an ordinary release


async def test_a_lease_found_gone_while_its_jobs_write_is_on_its_way_is_held_until_that_write_is_answered(
    redis: Redis,
) -> None:
    leases = Leases(redis, lease_ms=1_000)
    job = new_job_id()
    assert await leases.acquire(job, "token-a", 1_000)
    with leases.writing(job, "token-a"):
        await redis.delete(keys.lease(job))  # the write ended the job in Redis; its reply is not read yet
        assert await leases.renew_many([(job, "token-a")], 2_000) == [True]
    # answered without ending the job (its `released` never came): the lease is lost
    assert await leases.renew_many([(job, "token-a")], 2_000) == [False]


def _fold(*events: JobEvent) -> JobView:
    view = fold(events)
    assert view is not None
    return view


async def test_a_promotion_runs_its_script_only_in_the_partitions_where_a_job_is_due(
    redis: Redis, backend: str
) -> None:
    leases = Leases(redis, lease_ms=1_000)
    jobs = [new_job_id() for _ in range(20)]  # spread over many partitions
    for job_id in jobs:
        assert await leases.acquire(job_id, f"token-{job_id}", 1_000)  # each due at 2 000 (its lease lapses)
    # When nothing is due yet, and then when every job is
    if backend == "single":
        await redis.config_resetstat()
    assert await leases.promote_due(1_999) == []
    if backend == "single":  # (one Redis: its INFO commandstats) nothing due: one read a partition, no script
        calls = await _calls(redis)
        assert (calls.get("evalsha", 0), calls["zrangebyscore"]) == (0, len(keys.partitions()))
    # Then every job is promoted once, its wake-up pushed out by a lease
    assert sorted(await leases.promote_due(2_000)) == sorted(jobs)
    assert await leases.promote_due(2_000) == []
    for job_id in jobs:
        assert await redis.zscore(keys.due(keys.partition_of(job_id)), job_id) == 3_000


async def _calls(redis: Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}
