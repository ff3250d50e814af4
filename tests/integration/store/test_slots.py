"""One slot per atomic write (DESIGN §6, SPEC S9): every script and MULTI of the store, run against a real
Redis in cluster mode, where a write whose KEYS span two hash slots fails with CROSSSLOT.

The node owns every slot, so a plain client reaches all keys and the only thing that can fail is the slot
rule itself. Writes known to span slots until the partitioned layout lands are strict xfails: each one
that becomes single-slot turns its mark into a failure, so the list can only shrink.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import redis as sync_redis
from redis.asyncio import Redis
from redis.exceptions import ClusterCrossSlotError

from broker.events import HoldReason, JobCreated, JobStatus
from broker.store import keys
from broker.store.admission import AdmissionStore, Pacing
from broker.store.board import BoardStore
from broker.store.jobs import JobStore
from broker.store.leases import Leases
from broker.store.listing import IndexRepair, Listing
from projections.job import apply
from tests.conftest import RedisServer

Operation = Callable[[Redis], Awaitable[object]]
CROSSSLOT_UNTIL_PARTITIONS = "spans the job's slot and a global key until the partitioned layout (issue 12)"


@pytest.fixture(scope="module")
def cluster_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    directory: Path = tmp_path_factory.mktemp("cluster-node")
    server = RedisServer(directory, "--cluster-enabled", "yes", "--cluster-config-file", str(directory / "nodes.conf"))
    server.start()
    client = sync_redis.Redis(port=server.port)
    client.execute_command("CLUSTER", "ADDSLOTS", *range(16384))
    deadline = time.monotonic() + 10
    while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
        assert time.monotonic() < deadline, "the one-node cluster did not come up"
        time.sleep(0.05)
    client.close()
    yield server
    server.stop()


@pytest.fixture
async def node(cluster_node: RedisServer) -> AsyncIterator[Redis]:
    client = Redis(port=cluster_node.port, decode_responses=True)
    await client.flushall()
    yield client
    await client.aclose()


JOB = "job_" + "a" * 32


async def _create(redis: Redis) -> None:
    event = JobCreated(job_id=JOB, at_ms=1_000, body='{"input":"x"}', fingerprint="f")
    view = apply(None, event)
    assert view is not None
    await JobStore(redis, retention_ms=60_000).create(event, view)


def _admission(redis: Redis) -> AdmissionStore:
    return AdmissionStore(redis, Pacing())


async def _admit(redis: Redis) -> object:
    return await _admission(redis).admit(1_000, 5)


async def _accepted(redis: Redis) -> object:
    return await _admission(redis).accepted(JOB, 1_000)


async def _refused(redis: Redis) -> object:
    store = _admission(redis)
    return await store.refused(
        JOB, 1_000, reason=HoldReason.BUSY, detail="Full.", retry_after_ms=1_000, jitter=0.5, place="1"
    )


async def _release(redis: Redis) -> object:
    return await _admission(redis).release(JOB, freed=True)


async def _requeue(redis: Redis) -> object:
    return await _admission(redis).requeue(JOB, "1")


async def _lease(redis: Redis) -> object:
    return await Leases(redis, lease_ms=1_000).acquire(JOB, "token", 1_000)


async def _board_ack(redis: Redis) -> object:
    return await BoardStore(redis).ack(JOB, 1, 2)


async def _board_outbox_done(redis: Redis) -> object:
    return await BoardStore(redis).done(["1-1"])


async def _reindex(redis: Redis) -> object:
    event = JobCreated(job_id=JOB, at_ms=1_000, body='{"input":"x"}', fingerprint="f")
    view = apply(None, event)
    assert view is not None
    await redis.hset(keys.view(JOB), "last_id", "1-1")  # type: ignore[misc]
    return await IndexRepair(redis).job(view, "1-1", write=True)


async def _list_statuses(redis: Redis) -> object:
    return await Listing(redis, retention_ms=60_000).page([JobStatus.QUEUED, JobStatus.RUNNING], 10, None, 2_000)


async def _list_one_status(redis: Redis) -> object:
    return await Listing(redis, retention_ms=60_000).page([JobStatus.QUEUED], 10, None, 2_000)


SINGLE_SLOT: list[tuple[str, Operation]] = [
    ("admission_admit", _admit),
    ("admission_accepted", _accepted),
    ("admission_refused", _refused),
    ("admission_release", _release),
    ("admission_requeue", _requeue),
    ("board_ack", _board_ack),
    ("board outbox ack+delete (MULTI)", _board_outbox_done),
    ("listing read of one status (MULTI)", _list_one_status),
]
CROSS_SLOT: list[tuple[str, Operation]] = [
    ("append_events (create)", _create),
    ("acquire_lease", _lease),
    ("reindex_job", _reindex),
    ("listing read over two statuses (MULTI)", _list_statuses),
]


@pytest.mark.parametrize(("name", "operation"), SINGLE_SLOT, ids=[name for name, _ in SINGLE_SLOT])
async def test_the_write_touches_one_slot(node: Redis, name: str, operation: Operation) -> None:
    await operation(node)  # raises CROSSSLOT otherwise


@pytest.mark.parametrize(
    ("name", "operation"),
    [
        pytest.param(
            name,
            op,
            marks=pytest.mark.xfail(strict=True, raises=ClusterCrossSlotError, reason=CROSSSLOT_UNTIL_PARTITIONS),
        )
        for name, op in CROSS_SLOT
    ],
    ids=[name for name, _ in CROSS_SLOT],
)
async def test_known_cross_slot_writes_still_span_slots(node: Redis, name: str, operation: Operation) -> None:
    await operation(node)


async def test_the_node_refuses_a_cross_slot_script(node: Redis) -> None:
    # The check itself can fail: a script over keys of two slots is refused here.
    with pytest.raises(ClusterCrossSlotError):
        await node.eval("return redis.call('SET', KEYS[1], '1')", 2, "{a}x", "{b}y")
