"""Board delivery state (SPEC S5.3-S5.6): the outbox group, per-key locks, acks, due refreshes, the index.

The job write script persists each version with its pending delivery (append_events.lua); this module is
what the sender and the reconciler read and change afterwards. The outbox, due set and index are per
partition (the job's slot, written with the job); on a single Redis the sender blocks on every outbox at
once (one XREADGROUP), on a cluster it reads each partition's outbox without blocking (one pipeline, one
round trip per node) and between empty rounds blocks on the board bell, a hint stream every job write with
a new board version rings. Fields of a board hash `hbr:{pN}:J:board`:

field           holds                                                       written by
latest          the latest report, bytes exactly as rendered                job write
latest_at       its `at`                                                    job write
pending_at      the version waiting for delivery (absent: none)             job write; cleared by its own ack
pending_change  '1' while the pending delivery includes a state change      job write; cleared with pending_at
expire_at       sourceActivityAt + HERMES_TTL (also the key's PEXPIREAT)    job write
acked_at        the newest acknowledged `at`                                ack
delivered_ms    when the key was last delivered (a 2xx); refreshes count    ack
"""

from __future__ import annotations

import asyncio
import secrets
from importlib import resources
from typing import cast

from attrs import frozen
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError
from redis.typing import KeyT, StreamIdT

from broker.store import keys
from broker.store.connection import is_cluster
from broker.store.scripts import ring_work, run_many

RETAINED_PAGE = 500
CLUSTER_POLL_MS = 200  #: the pause between empty outbox rounds on a cluster


def new_token() -> str:
    return secrets.token_hex(12)


def _script(redis: Redis, name: str) -> AsyncScript:
    return redis.register_script(resources.files("broker.store").joinpath("scripts", f"{name}.lua").read_text())


@frozen
class OutboxEntry:
    """One doorbell of the board outbox: deliver what the key's hash holds now."""

    entry_id: str
    job_id: str
    partition: int  #: the outbox it came from


@frozen(kw_only=True)
class BoardEntry:
    """A board hash as read (see the module docstring)."""

    job_id: str
    latest: bytes
    latest_at: int
    expire_at: int
    pending_at: int | None = None
    pending_change: bool = False
    acked_at: int | None = None
    delivered_ms: int | None = None

    @classmethod
    def from_hash(cls, job_id: str, fields: dict[str, str]) -> BoardEntry | None:
        """None for a hash without a readable latest version (gone, or written by no job write)."""
        if "latest" not in fields or not fields.get("latest_at", "").isdigit():
            return None
        return cls(
            job_id=job_id,
            latest=fields["latest"].encode(),
            latest_at=int(fields["latest_at"]),
            expire_at=_number(fields.get("expire_at")) or 0,
            pending_at=_number(fields.get("pending_at")),
            pending_change=fields.get("pending_change") == "1",
            acked_at=_number(fields.get("acked_at")),
            delivered_ms=_number(fields.get("delivered_ms")),
        )


class BoardStore:
    """The board's Redis operations; each multi-key change is one script or one transaction."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._cluster = is_cluster(redis)
        self._bell = "$"  #: the board bell read up to (cluster)
        self._rung: set[int] = set()  #: partitions the bell named since the last read (cluster)
        self._ack = _script(redis, "board_ack")
        self._promote = _script(redis, "board_promote")
        self._release = _script(redis, "release_lock")

    async def ensure_group(self) -> None:
        """Create the senders' group on every partition's outbox; a group that exists is left alone."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for partition in keys.partitions():
                pipe.xgroup_create(keys.board_outbox(partition), keys.BOARD_OUTBOX_GROUP, id="0", mkstream=True)
            replies = await pipe.execute(raise_on_error=False)
        for reply in replies:
            if isinstance(reply, Exception) and "BUSYGROUP" not in str(reply):
                raise reply

    async def _ensure_group(self, partition: int) -> None:
        try:
            await self._redis.xgroup_create(
                keys.board_outbox(partition), keys.BOARD_OUTBOX_GROUP, id="0", mkstream=True
            )
        except ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise

    async def read_outbox(self, consumer: str, count: int, block_ms: int) -> list[OutboxEntry]:
        """New outbox entries for `consumer`; lost groups are recreated (NOGROUP)."""
        if not self._cluster:
            streams: dict[KeyT, StreamIdT] = {keys.board_outbox(partition): ">" for partition in keys.partitions()}
            try:
                reply = await self._redis.xreadgroup(
                    keys.BOARD_OUTBOX_GROUP, consumer, streams, count=count, block=block_ms
                )
            except ResponseError as error:
                if "NOGROUP" not in str(error):
                    raise
                await self.ensure_group()
                return []
            return _read(reply)
        # the partitions a bell named (a new version there), else all of them
        partitions, self._rung = sorted(self._rung) or list(keys.partitions()), set()
        async with self._redis.pipeline(transaction=False) as pipe:
            for partition in partitions:
                pipe.xreadgroup(keys.BOARD_OUTBOX_GROUP, consumer, {keys.board_outbox(partition): ">"}, count=count)
            replies = await pipe.execute(raise_on_error=False)
        entries: list[OutboxEntry] = []
        for partition, reply in zip(partitions, replies, strict=True):
            if isinstance(reply, ResponseError) and "NOGROUP" in str(reply):
                await self._ensure_group(partition)
            elif isinstance(reply, Exception):
                raise reply
            else:
                entries.extend(_read(reply))
        if not entries and len(partitions) == keys.PARTITIONS:
            await self._wait_for_bell(block_ms)
        return entries

    async def _wait_for_bell(self, block_ms: int) -> None:
        """Block until a job write rings the board bell (or `block_ms` passes): then the outboxes are read.
        The bell is read on from the last id seen, so a ring between the outbox read and this wait counts."""
        try:
            if self._bell == "$":
                newest = cast(list[tuple[str, object]], await self._redis.xrevrange(keys.BOARD_BELL, count=1))
                self._bell = newest[0][0] if newest else "0-0"
                return  # the outboxes are read again first
            reply = await self._redis.xread({keys.BOARD_BELL: self._bell}, count=100, block=max(1, block_ms))
        except ResponseError:
            await asyncio.sleep(CLUSTER_POLL_MS / 1000)
            return
        for _, batch in cast(list[tuple[str, list[tuple[str, dict[str, str]]]]], reply or []):
            if batch:
                self._bell = batch[-1][0]
                self._rung.update(keys.partition_of(fields.get("job", "")) for _, fields in batch)

    async def claim_stale(self, consumer: str, min_idle_ms: int, count: int = 100) -> list[OutboxEntry]:
        """Entries a dead consumer read and never acknowledged (XAUTOCLAIM on every partition's outbox)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for partition in keys.partitions():
                pipe.xautoclaim(
                    keys.board_outbox(partition),
                    keys.BOARD_OUTBOX_GROUP,
                    consumer,
                    min_idle_ms,
                    start_id="0-0",
                    count=count,
                )
            replies = await pipe.execute(raise_on_error=False)
        entries: list[OutboxEntry] = []
        for partition, reply in zip(keys.partitions(), replies, strict=True):
            if isinstance(reply, ResponseError) and "NOGROUP" in str(reply):
                await self._ensure_group(partition)
                continue
            if isinstance(reply, Exception):
                raise reply
            # [next id, [(id, fields) | None ...], (Redis 7: deleted ids)]
            claimed = cast(list[object], reply)
            batch = cast(list[tuple[str, dict[str, str] | None]], claimed[1] if len(claimed) > 1 else [])
            entries.extend(_entries(partition, batch))
        return entries

    async def done(self, entries: list[OutboxEntry]) -> None:
        """Acknowledge and delete handled outbox entries (one MULTI per partition: one slot each)."""
        for partition, ids in _by_partition(entries).items():
            outbox = keys.board_outbox(partition)
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.xack(outbox, keys.BOARD_OUTBOX_GROUP, *ids)
                pipe.xdel(outbox, *ids)
                await pipe.execute()

    async def handover(self, job_id: str, entries: list[OutboxEntry]) -> None:
        """Give entries back as one new entry that any sender reads at once (this one is stopping)."""
        home = keys.partition_of(job_id)
        by_partition = _by_partition(entries)
        outbox = keys.board_outbox(home)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xadd(outbox, {"job": job_id, "at": ""}, maxlen=100_000, approximate=True)
            if by_partition.get(home):
                pipe.xack(outbox, keys.BOARD_OUTBOX_GROUP, *by_partition[home])
                pipe.xdel(outbox, *by_partition[home])
            await pipe.execute()
        await self.done([entry for entry in entries if entry.partition != home])

    async def acquire(self, lock: str, token: str, ttl_ms: int) -> bool:
        return bool(await self._redis.set(lock, token, nx=True, px=ttl_ms))

    async def release(self, lock: str, token: str) -> bool:
        return cast(int, await self._release(keys=[lock], args=[token])) == 1

    async def holds(self, lock: str, token: str) -> bool:
        return cast(str | None, await self._redis.get(lock)) == token

    async def lock_ttl_ms(self, lock: str) -> int:
        """Remaining ms of a lock; 0 when it has none (gone, or no expiry)."""
        return max(0, await self._redis.pttl(lock))

    async def load(self, job_id: str) -> BoardEntry | None:
        fields = cast(dict[str, str], await self._redis.hgetall(keys.board(job_id)))
        return BoardEntry.from_hash(job_id, fields)

    async def ack(self, job_id: str, at_ms: int, now_ms: int) -> bool:
        """Record a 2xx of version `at_ms`; True when it was the pending version and is cleared now."""
        return cast(int, await self._ack(keys=[keys.board(job_id)], args=[at_ms, now_ms])) == 1

    async def schedule(self, job_id: str, due_at_ms: int) -> None:
        """Look at the key again at `due_at_ms`, or earlier when it is due earlier already (ZADD LT)."""
        await self._redis.zadd(keys.board_due(keys.partition_of(job_id)), {job_id: due_at_ms}, lt=True)

    async def promote_due(self, now_ms: int, limit: int = 100) -> list[str]:
        """Put every key whose refresh is due on its outbox (atomically, once), in every partition."""
        calls = [
            ([keys.board_due(partition), keys.board_outbox(partition)], [now_ms, limit])
            for partition in keys.partitions()
        ]
        replies = await run_many(self._redis, self._promote, calls)
        return [
            item.decode() if isinstance(item, bytes) else str(item)
            for reply in replies
            for item in cast(list[object], reply)
        ]

    async def forget_expired(self, now_ms: int) -> int:
        """Drop index entries whose board key has expired (its PEXPIREAT is the same time)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for partition in keys.partitions():
                pipe.zremrangebyscore(keys.board_index(partition), "-inf", now_ms)
            return sum(int(count) for count in await pipe.execute())

    async def retained(self, now_ms: int, offset: int = 0, count: int = RETAINED_PAGE) -> list[str]:
        """Job ids of board keys that have not expired, one page (`offset` counts over the partitions in
        order, each soonest expiry first)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for partition in keys.partitions():
                pipe.zcount(keys.board_index(partition), f"({now_ms}", "+inf")
            sizes = [int(size) for size in await pipe.execute()]
        found: list[str] = []
        for partition, size in zip(keys.partitions(), sizes, strict=True):
            index = keys.board_index(partition)
            if size == 0:
                continue
            if offset >= size:
                offset -= size
                continue
            members = await self._redis.zrangebyscore(index, f"({now_ms}", "+inf", start=offset, num=count - len(found))
            found.extend(cast(list[str], members))
            offset = 0
            if len(found) >= count:
                break
        return found

    async def ring_driver(self, job_id: str, now_ms: int) -> None:
        """Make the job due now and ring the work doorbell, so a driver takes it (after a repair resubmits)."""
        await self._redis.zadd(keys.due(keys.partition_of(job_id)), {job_id: now_ms})
        await ring_work(self._redis, {"job": job_id})

    async def owned(self, job_id: str) -> bool:
        """Whether a replica holds the job's run lease (drives it)."""
        return bool(await self._redis.exists(keys.lease(job_id)))


def _read(reply: object) -> list[OutboxEntry]:
    # redis-py types XREADGROUP loosely; with decode_responses=True it is [[stream, [(id, fields)]]].
    batches = cast(list[tuple[str, list[tuple[str, dict[str, str] | None]]]], reply or [])
    return [entry for stream, batch in batches for entry in _entries(keys.partition_of_key(stream) or 0, batch)]


def _entries(partition: int, batch: list[tuple[str, dict[str, str] | None]]) -> list[OutboxEntry]:
    # An entry deleted while pending comes back without fields: job "" (nothing to deliver; acknowledge it).
    return [OutboxEntry(entry_id, (fields or {}).get("job", ""), partition) for entry_id, fields in batch]


def _by_partition(entries: list[OutboxEntry]) -> dict[int, list[str]]:
    grouped: dict[int, list[str]] = {}
    for entry in entries:
        grouped.setdefault(entry.partition, []).append(entry.entry_id)
    return grouped


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None
