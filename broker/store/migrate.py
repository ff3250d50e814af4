"""Layout 1 (before partitions) -> the partitioned layout (SPEC S9): detection and the one migration.

A store written by a broker before the partitioned layout has its jobs under `hbr:{J}:*` and the global
`hbr:work`, `hbr:due`, `hbr:board:*`, `hbr:{adm}:line` (and the listing indexes `hbr:runs`,
`hbr:runs:<status>`). The broker never ignores such jobs silently:
it refuses to start on them (`legacy_keys`), and `python scripts/migrate_layout.py` moves them, on a
single Redis, with every broker stopped: each job's keys are renamed into its partition (RENAME keeps
their expiry), the schedule, line, board due set and index entries are moved with their scores, board
outbox entries are re-added to their partition's outbox, and the work stream (doorbells: hints) is
dropped. Every step writes the new place before deleting the old, so a migration that stops half way is
simply run again.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import cast

from attrs import define
from redis.asyncio import Redis

from broker.events import JobStatus
from broker.store import keys
from broker.store.board import BoardStore
from broker.store.work import ensure_group

MIGRATION_COMMAND = "python scripts/migrate_layout.py"
_PAGE = 1_000
_KINDS = {"events": keys.events, "view": keys.view, "lease": keys.lease, "board": keys.board}


@define
class Moved:
    job_keys: int = 0
    schedule: int = 0
    line: int = 0
    board_due: int = 0
    board_index: int = 0
    outbox: int = 0
    listing: int = 0


async def legacy_keys(redis: Redis) -> list[str]:
    """Keys of layout 1 found in the store (the global ones, and a first page of job keys)."""
    found = [key for key in keys.Legacy.GLOBALS if await redis.exists(key)]
    _, page = await redis.scan(0, match=keys.Legacy.JOB_MATCH, count=_PAGE)
    found.extend(cast(list[str], page)[:3])
    return found


async def migrate(redis: Redis) -> Moved:
    moved = Moved()
    async for key in redis.scan_iter(match=keys.Legacy.JOB_MATCH, count=_PAGE):
        parts = keys.Legacy.job_key_parts(key)
        if parts is None or parts[1] not in _KINDS:
            continue
        job_id, kind = parts
        await redis.rename(key, _KINDS[kind](job_id))
        moved.job_keys += 1
    moved.schedule = await _move_zset(redis, keys.Legacy.DUE, keys.due)
    moved.line = await _move_zset(redis, keys.Legacy.ADMISSION_LINE, keys.line)
    moved.board_due = await _move_zset(redis, keys.Legacy.BOARD_DUE, keys.board_due)
    moved.board_index = await _move_zset(redis, keys.Legacy.BOARD_INDEX, keys.board_index)
    moved.listing = await _move_zset(redis, keys.Legacy.RUNS, keys.runs)
    for status in JobStatus:
        moved.listing += await _move_zset(redis, keys.Legacy.runs_index(status.value), partial(_status_index, status))
    await BoardStore(redis).ensure_group()
    entries = cast(list[tuple[str, dict[str, str]]], await redis.xrange(keys.Legacy.BOARD_OUTBOX))
    for _, fields in entries:
        job_id = fields.get("job", "")
        if job_id:
            outbox = keys.board_outbox(keys.partition_of(job_id))
            await redis.xadd(outbox, {"job": job_id, "at": fields.get("at", "")}, maxlen=100_000, approximate=True)
            moved.outbox += 1
    await redis.delete(keys.Legacy.BOARD_OUTBOX, keys.Legacy.WORK)
    await ensure_group(redis)
    return moved


def _status_index(status: JobStatus, partition: int) -> str:
    return keys.runs_index(partition, status.value)


async def _move_zset(redis: Redis, old: str, new: Callable[[int], str]) -> int:
    members = cast(list[tuple[str, float]], await redis.zrange(old, 0, -1, withscores=True))
    by_partition: dict[str, dict[str, float]] = {}
    for job_id, score in members:
        by_partition.setdefault(new(keys.partition_of(job_id)), {})[job_id] = score
    for key, mapping in by_partition.items():
        await redis.zadd(key, mapping)
    await redis.delete(old)
    return len(members)
