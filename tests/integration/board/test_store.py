"""The board's Redis operations (SPEC S5.3, S5.5): exact-version acks, promotion once, token locks, the index."""

from __future__ import annotations

import time

from redis.asyncio import Redis

from broker.store import keys
from broker.store.board import BoardStore

NOW = time.time_ns() // 1_000_000
DAY = 86_400_000  #: entries outlive the whole session (NOW is taken at collection time)


async def persist(redis: Redis, job_id: str, at: int, *, change: bool = True, expire_at: int = NOW + DAY) -> None:
    """What the job write leaves for a new version (append_events.lua), without the outbox doorbell."""
    fields = {"latest": f'{{"at":{at}}}', "latest_at": at, "pending_at": at, "expire_at": expire_at}
    await redis.hset(keys.board(job_id), mapping=fields)  # type: ignore[arg-type]
    if change:
        await redis.hset(keys.board(job_id), "pending_change", "1")
    await redis.pexpireat(keys.board(job_id), expire_at)
    await redis.zadd(keys.board_index(keys.partition_of(job_id)), {job_id: expire_at})


async def test_an_ack_clears_only_its_own_version(redis: Redis) -> None:
    store = BoardStore(redis)
    await persist(redis, "job_a", NOW)
    await persist(redis, "job_a", NOW + 5, change=False)  # a newer version persisted while NOW was in flight
    assert await store.ack("job_a", NOW, NOW + 10) is False
    entry = await store.load("job_a")
    assert entry is not None and entry.pending_at == NOW + 5 and entry.pending_change
    assert entry.acked_at == NOW and entry.delivered_ms == NOW + 10
    assert await store.ack("job_a", NOW + 5, NOW + 20) is True
    entry = await store.load("job_a")
    assert entry is not None and entry.pending_at is None and not entry.pending_change and entry.acked_at == NOW + 5
    assert await store.ack("job_a", NOW, NOW + 30) is False  # a late ack of an older version
    entry = await store.load("job_a")
    assert entry is not None and entry.acked_at == NOW + 5


async def test_an_ack_never_recreates_an_expired_hash(redis: Redis) -> None:
    assert await BoardStore(redis).ack("job_gone", NOW, NOW) is False
    assert not await redis.exists(keys.board("job_gone"))


async def test_due_refreshes_are_promoted_once(redis: Redis) -> None:
    store = BoardStore(redis)
    await store.schedule("job_a", NOW)
    await store.schedule("job_b", NOW + 1_000)
    await store.schedule("job_b", NOW + 5_000)  # LT: a later time never postpones an earlier one
    assert await redis.zscore(keys.board_due(keys.partition_of("job_b")), "job_b") == NOW + 1_000
    assert await store.promote_due(NOW) == ["job_a"]
    assert await store.promote_due(NOW) == []
    await store.ensure_group()
    entries = await store.read_outbox("c1", 10, 10)
    assert [entry.job_id for entry in entries] == ["job_a"]


async def test_a_lost_group_is_recreated(redis: Redis) -> None:
    store = BoardStore(redis)
    assert await store.read_outbox("c1", 10, 10) == []  # NOGROUP: created now
    outbox = keys.board_outbox(keys.partition_of("job_a"))
    await redis.xadd(outbox, {"job": "job_a", "at": "1"})
    entries = await store.read_outbox("c1", 10, 10)
    assert [entry.job_id for entry in entries] == ["job_a"]
    await store.done(entries)
    assert await redis.xlen(outbox) == 0


async def test_a_lock_is_released_only_by_its_holder(redis: Redis) -> None:
    store = BoardStore(redis)
    lock = keys.board_lock("job_a")
    assert lock == "hbr:lock:board:job_a"
    assert await store.acquire(lock, "t1", 10_000)
    assert not await store.acquire(lock, "t2", 10_000)
    assert not await store.release(lock, "t2") and await store.holds(lock, "t1")
    assert await store.release(lock, "t1") and not await redis.exists(lock)


async def test_the_index_lists_retained_keys_and_forgets_expired_ones(redis: Redis) -> None:
    store = BoardStore(redis)
    await redis.zadd(keys.board_index(keys.partition_of("job_old")), {"job_old": NOW - 1})
    await redis.zadd(keys.board_index(keys.partition_of("job_new")), {"job_new": NOW + 1})
    assert await store.retained(NOW) == ["job_new"]
    assert await store.forget_expired(NOW) == 1
    assert await redis.zrange(keys.board_index(keys.partition_of("job_new")), 0, -1) == ["job_new"]
