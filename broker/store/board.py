"""Board delivery state (SPEC S5.3-S5.6): the outbox group, per-key locks, acks, due refreshes, the index.

The job write script persists each version with its pending delivery (append_events.lua); this module is
what the sender and the reconciler read and change afterwards. Fields of a board hash `hbr:{J}:board`:

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

import secrets
from importlib import resources
from typing import cast

from attrs import frozen
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import ResponseError

from broker.store import keys

RETAINED_PAGE = 500


def new_token() -> str:
    return secrets.token_hex(12)


def _script(redis: Redis, name: str) -> AsyncScript:
    return redis.register_script(resources.files("broker.store").joinpath("scripts", f"{name}.lua").read_text())


@frozen
class OutboxEntry:
    """One doorbell of the board outbox: deliver what the key's hash holds now."""

    entry_id: str
    job_id: str


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
        self._ack = _script(redis, "board_ack")
        self._promote = _script(redis, "board_promote")
        self._release = _script(redis, "release_lock")

    async def ensure_group(self) -> None:
        """Create the senders' group (and the outbox); a group that exists is left alone."""
        try:
            await self._redis.xgroup_create(keys.BOARD_OUTBOX, keys.BOARD_OUTBOX_GROUP, id="0", mkstream=True)
        except ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise

    async def read_outbox(self, consumer: str, count: int, block_ms: int) -> list[OutboxEntry]:
        """New outbox entries for `consumer`; the group is recreated when it was lost (NOGROUP)."""
        try:
            reply = await self._redis.xreadgroup(
                keys.BOARD_OUTBOX_GROUP, consumer, {keys.BOARD_OUTBOX: ">"}, count=count, block=block_ms
            )
        except ResponseError as error:
            if "NOGROUP" not in str(error):
                raise
            await self.ensure_group()
            return []
        # redis-py types XREADGROUP loosely; with decode_responses=True it is [[stream, [(id, fields)]]].
        batches = cast(list[tuple[str, list[tuple[str, dict[str, str] | None]]]], reply or [])
        return [entry for _, batch in batches for entry in _entries(batch)]

    async def claim_stale(self, consumer: str, min_idle_ms: int, count: int = 100) -> list[OutboxEntry]:
        """Entries a dead consumer read and never acknowledged (XAUTOCLAIM)."""
        try:
            reply = await self._redis.xautoclaim(
                keys.BOARD_OUTBOX, keys.BOARD_OUTBOX_GROUP, consumer, min_idle_ms, start_id="0-0", count=count
            )
        except ResponseError as error:
            if "NOGROUP" not in str(error):
                raise
            await self.ensure_group()
            return []
        # [next id, [(id, fields) | None ...], (Redis 7: deleted ids)]
        claimed = cast(list[object], reply)
        return _entries(cast(list[tuple[str, dict[str, str] | None]], claimed[1] if len(claimed) > 1 else []))

    async def done(self, entry_ids: list[str]) -> None:
        """Acknowledge and delete handled outbox entries."""
        if not entry_ids:
            return
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xack(keys.BOARD_OUTBOX, keys.BOARD_OUTBOX_GROUP, *entry_ids)
            pipe.xdel(keys.BOARD_OUTBOX, *entry_ids)
            await pipe.execute()

    async def handover(self, job_id: str, entry_ids: list[str]) -> None:
        """Give entries back as one new entry that any sender reads at once (this one is stopping)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xadd(keys.BOARD_OUTBOX, {"job": job_id, "at": ""}, maxlen=100_000, approximate=True)
            if entry_ids:
                pipe.xack(keys.BOARD_OUTBOX, keys.BOARD_OUTBOX_GROUP, *entry_ids)
                pipe.xdel(keys.BOARD_OUTBOX, *entry_ids)
            await pipe.execute()

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
        await self._redis.zadd(keys.BOARD_DUE, {job_id: due_at_ms}, lt=True)

    async def promote_due(self, now_ms: int, limit: int = 100) -> list[str]:
        """Put every key whose refresh is due on the outbox (atomically, once)."""
        promoted = await self._promote(keys=[keys.BOARD_DUE, keys.BOARD_OUTBOX], args=[now_ms, limit])
        return [item.decode() if isinstance(item, bytes) else str(item) for item in cast(list[object], promoted)]

    async def forget_expired(self, now_ms: int) -> int:
        """Drop index entries whose board key has expired (its PEXPIREAT is the same time)."""
        return await self._redis.zremrangebyscore(keys.BOARD_INDEX, "-inf", now_ms)

    async def retained(self, now_ms: int, offset: int = 0, count: int = RETAINED_PAGE) -> list[str]:
        """Job ids of board keys that have not expired, soonest expiry first, one page."""
        members = await self._redis.zrangebyscore(keys.BOARD_INDEX, f"({now_ms}", "+inf", start=offset, num=count)
        return cast(list[str], members)

    async def ring_driver(self, job_id: str, now_ms: int) -> None:
        """Make the job due now and ring the work stream, so a driver takes it (after a repair resubmits)."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zadd(keys.DUE, {job_id: now_ms})
            pipe.xadd(keys.WORK, {"job": job_id}, maxlen=100_000, approximate=True)
            await pipe.execute()

    async def owned(self, job_id: str) -> bool:
        """Whether a replica holds the job's run lease (drives it)."""
        return bool(await self._redis.exists(keys.lease(job_id)))


def _entries(batch: list[tuple[str, dict[str, str] | None]]) -> list[OutboxEntry]:
    # An entry deleted while pending comes back without fields: job "" (nothing to deliver; acknowledge it).
    return [OutboxEntry(entry_id, (fields or {}).get("job", "")) for entry_id, fields in batch]


def _number(value: str | None) -> int | None:
    return int(value) if value is not None and value.lstrip("-").isdigit() else None
