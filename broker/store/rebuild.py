"""What the projection rebuild reads and writes (SPEC S7): a job's stream and stored projections, as stored.

Reads are raw (a view this replica cannot decode is a finding, not something to refold around); the one
write is replace_view.lua, guarded by the stream position the rebuild folded up to.
"""

from __future__ import annotations

from typing import cast

from attrs import frozen
from redis.asyncio import Redis

from broker.events import JobEvent
from broker.store import keys, lean
from broker.store.entries import Entries
from broker.store.jobs import BoardWrite
from broker.store.scripts import Scripts


@frozen(kw_only=True)
class StoredJob:
    """One job as read in one transaction: its events and the raw fields of its view and board hashes."""

    job_id: str
    history: list[tuple[str, JobEvent]]
    view: dict[str, str]  #: the view hash (empty: missing); a lean view with its whole JSON in `state` too
    board: dict[str, str]  #: the board hash (empty: missing or expired)

    @property
    def last_id(self) -> str | None:
        """The id of the stream's last entry; None for an empty stream."""
        return self.history[-1][0] if self.history else None


@frozen(kw_only=True)
class Replacement:
    """Rebuilt projections of one job and the positions they may replace."""

    last_id: str  #: the stream's last id the fold reached
    seen_view_last_id: str  #: the view's `last_id` as read ('' = none): changed meanwhile -> refused
    view: bytes
    board_state: bytes | None = None  #: None: the job has no board state
    board: BoardWrite | None = None  #: the latest version to store; None: leave the board hash alone
    runs: tuple[tuple[str, str], ...] = ()  #: the view hash's `run:<attempt>` fields (broker/store/entries.py)


class RebuildStore:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._scripts = Scripts(redis)

    async def read(self, job_id: str) -> StoredJob:
        # One MULTI: the per-job keys share a hash slot, and a live append cannot fall between the reads.
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xrange(keys.events(job_id), min="-", max="+")
            pipe.hgetall(keys.view(job_id))
            pipe.hgetall(keys.board(job_id))
            entries, view, board = await pipe.execute()
        # redis-py types these loosely; with decode_responses=True they are str pairs and str dicts.
        # a read from the start resolves packed entries from the stream itself (broker/store/entries.py)
        fields = cast(dict[str, str], view)
        history = await Entries(self._redis).events(job_id, _entries(entries), known=fields)
        state = lean.state_of(fields, history)  # a lean view's `state` is its JSON with the terminal entry's output
        if state is not None:
            fields = {**fields, keys.VIEW_STATE: state}
        return StoredJob(job_id=job_id, history=history, view=fields, board=cast(dict[str, str], board))

    async def replace(self, job_id: str, replacement: Replacement) -> bool:
        """Store `replacement` unless the job moved on since it was read; False when refused."""
        board = replacement.board
        board_args: list[str | int | bytes] = ["", 0, "0", 0, 0, 0]
        if board is not None and board.report is not None:
            board_args = [
                board.report,
                board.at_ms,
                "1" if board.state_change else "0",
                board.expire_at_ms,
                board.refresh_ms,
                board.now_ms,
            ]
        replaced = await self._scripts.replace_view(
            keys=[
                keys.events(job_id),
                keys.view(job_id),
                keys.board(job_id),
                keys.board_outbox(keys.partition_of(job_id)),
                keys.board_due(keys.partition_of(job_id)),
                keys.board_index(keys.partition_of(job_id)),
            ],
            args=[
                replacement.last_id,
                replacement.seen_view_last_id,
                replacement.view,
                replacement.board_state or "",
                job_id,
                *board_args,
                *(item for field_run in replacement.runs for item in field_run),
            ],
        )
        return cast(int, replaced) == 1


def _entries(reply: object) -> list[tuple[str, dict[str, str]]]:
    return cast(list[tuple[str, dict[str, str]]], reply)
