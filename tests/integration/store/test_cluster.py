"""The store on a real Redis Cluster (SPEC S9): scripts and pipelines routed per slot, WAIT on the node of
the write, jobs spread over every master."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import cast

import pytest
import redis as sync_redis
from redis.asyncio import Redis

from broker.errors import NotReplicated
from broker.events import JobCreated
from broker.ids import new_job_id
from broker.store import keys, signals
from broker.store.connection import connect
from broker.store.durability import Durability
from broker.store.jobs import JobStore
from broker.store.leases import Leases
from projections.job import apply
from tests.conftest import LocalCluster


@pytest.fixture
async def cluster(redis_cluster: LocalCluster) -> AsyncIterator[Redis]:
    redis_cluster.wait_ok()
    redis_cluster.flush()
    client = connect(redis_cluster.url, cluster=True)
    yield client
    await client.aclose()


async def _create(store: JobStore, job_id: str) -> None:
    event = JobCreated(job_id=job_id, at_ms=1_000, body='{"input":"x"}', fingerprint="f")
    view = apply(None, event)
    assert view is not None
    assert (await store.create(event, view)).created


async def test_jobs_spread_over_every_master(cluster: Redis, redis_cluster: LocalCluster) -> None:
    store = JobStore(cluster, retention_ms=60_000)
    jobs = [new_job_id() for _ in range(60)]
    for job_id in jobs:
        await _create(store, job_id)
    per_master = {}
    for node in redis_cluster.masters():
        client = sync_redis.Redis(port=node.port, decode_responses=True)
        per_master[node.port] = len([key for key in client.scan_iter(match=keys.EVENTS_MATCH)])
        client.close()
    assert len(per_master) == LocalCluster.MASTERS
    assert sum(per_master.values()) == len(jobs)
    assert all(count > 0 for count in per_master.values()), per_master
    assert [job_id async for job_id in store.job_ids()].__len__() == len(jobs)  # SCAN over every master


async def test_due_jobs_of_every_partition_are_promoted_once(cluster: Redis) -> None:
    leases = Leases(cluster, lease_ms=1_000)
    jobs = [new_job_id() for _ in range(20)]
    for job_id in jobs:
        assert await leases.acquire(job_id, "token", 0)  # due for takeover at 1 000
    assert sorted(await leases.promote_due(5_000)) == sorted(jobs)
    assert await leases.promote_due(5_000) == []  # pushed out by a lease
    assert await cluster.xlen(keys.WORK) == len(jobs)  # one doorbell each


async def test_a_write_waits_for_its_replica(cluster: Redis) -> None:
    # one replica per master: WAIT 1 is met, WAIT 2 never is
    store = JobStore(cluster, retention_ms=60_000, durability=Durability(1, 2_000))
    await _create(store, new_job_id())
    impossible = JobStore(cluster, retention_ms=60_000, durability=Durability(2, 100))
    job_id = new_job_id()
    with pytest.raises(NotReplicated):
        await _create(impossible, job_id)
    assert await store.load(job_id) is not None  # the write stands on the master: a retry replays it


async def test_a_nudge_reaches_every_subscriber(cluster: Redis, redis_cluster: LocalCluster) -> None:
    # subscribers on two clients (two replicas); the publisher is routed to whatever node it picks
    async def first_nudge(client: Redis) -> str:
        stream = cast(AsyncGenerator[str, None], signals.nudges(client))
        try:
            return await anext(stream)
        finally:
            await stream.aclose()  # unsubscribes and closes its connection now

    other = connect(redis_cluster.url, cluster=True)
    try:
        waiting = [asyncio.create_task(first_nudge(client)) for client in (cluster, other)]
        job_id = new_job_id()
        async with asyncio.timeout(10):
            while not all(task.done() for task in waiting):
                await signals.nudge(cluster, job_id)
                await asyncio.sleep(0.05)
        assert [task.result() for task in waiting] == [job_id, job_id]
    finally:
        await other.aclose()
