"""Lean views (SPEC S3.6, issue 21): a finished job's view hash without the second copy of its `output`.

A finished job's terminal entry (`JobFinished`) carries its whole output, and its view JSON carried it again:
after the delta window that copy was about a third of what the job kept in Redis. So when a job's deltas are
removed (remove_deltas.lua) the view JSON moves from the field `state` to `lean`, without the output, beside
`output_at`, the id of the entry that holds it; the script checks first that the entry's output is the view's.
A reader of a lean view takes the output from that entry (one XRANGE of one id): the job object, the listing,
the board and the rebuild see the same view as before. A view with `state` reads as it always did (what a
broker before this version stored, and any later write of the job, which stores its whole view again).

A broker before this version reads a hash without `state` as a view it must refold (its GET is right, its
listing leaves the job out), so lean views are a store-wide switch as packed entries are (broker/codec.py):
`hbr:views` = `lean`, set on a fresh or embedded store at startup and by `scripts/event_format.py lean`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import cast

from attrs import evolve
from redis.asyncio import Redis

from broker.codec import decode, decode_view, encode_view
from broker.events import JobEvent, JobFinished
from broker.store import keys
from projections.job import JobView

#: HMGET fields of a view hash that make its view: `state`, or `lean` and `output_at`
VIEW_FIELDS = (keys.VIEW_STATE, keys.VIEW_LEAN, keys.VIEW_OUTPUT_AT)


def lean_args(state: str | None) -> tuple[bytes, str]:
    """remove_deltas.lua's ARGV[3], ARGV[4] for a job whose stored view JSON is `state`: its lean JSON and the
    SHA-1 of `state` (the script stores it only if the view did not change since); (b"", "") for none."""
    view = decode_view(state) if state else None
    if view is None or not view.status.terminal or view.output is None:
        return b"", ""
    return encode_view(evolve(view, output=None)), hashlib.sha1(cast(str, state).encode()).hexdigest()


def completed(lean: str, terminal: JobEvent | None) -> JobView | None:
    """The view of a lean view JSON given its terminal event; None when either is unreadable."""
    view = decode_view(lean)
    if view is None or not isinstance(terminal, JobFinished) or terminal.output is None:
        return None
    return evolve(view, output=terminal.output)


def terminal_entry(entries: Sequence[tuple[str, dict[str, str]]]) -> JobEvent | None:
    """The event of the entry an `XRANGE output_at output_at` answered (full entries only: a JobFinished)."""
    return decode(entries[0][1].get(keys.EVENT_FIELD, "")) if entries else None


def lean_at(fields: dict[str, str]) -> str | None:
    """The id of the entry holding the output a lean view hash leaves out ('' when it names none); None when the
    hash holds its whole view in `state` (a `state` wins: any write after the lean move stores it again)."""
    if keys.VIEW_STATE in fields or keys.VIEW_LEAN not in fields:
        return None
    return fields.get(keys.VIEW_OUTPUT_AT, "")


def view_of(fields: dict[str, str], terminal: JobEvent | None) -> JobView | None:
    """The view of a view hash's fields, a lean one completed from its terminal event (None: none, or unreadable)."""
    if lean_at(fields) is None:
        return decode_view(fields.get(keys.VIEW_STATE, ""))
    return completed(fields[keys.VIEW_LEAN], terminal)


async def read_view(redis: Redis, job_id: str, fields: dict[str, str]) -> JobView | None:
    """The view of a job's view hash fields (None: none, or unreadable: the caller refolds)."""
    at = lean_at(fields)
    entries = await redis.xrange(keys.events(job_id), at, at, count=1) if at else []
    return view_of(fields, terminal_entry(_entries(entries)))


async def read_views(redis: Redis, job_ids: Sequence[str]) -> list[JobView | None]:
    """The views of several jobs (one pipeline, and one more for the lean ones among them)."""
    async with redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.hmget(keys.view(job_id), list(VIEW_FIELDS))
        replies = cast(list[list[str | None]], await pipe.execute())
    found = [
        {name: value for name, value in zip(VIEW_FIELDS, reply, strict=True) if value is not None} for reply in replies
    ]
    lean = {i: at for i, fields in enumerate(found) if (at := lean_at(fields))}
    terminals: dict[int, JobEvent | None] = {}
    if lean:
        async with redis.pipeline(transaction=False) as pipe:
            for i, at in lean.items():
                pipe.xrange(keys.events(job_ids[i]), at, at, count=1)
            entries = await pipe.execute()
        terminals = {i: terminal_entry(_entries(reply)) for i, reply in zip(lean, entries, strict=True)}
    return [view_of(fields, terminals.get(i)) for i, fields in enumerate(found)]


def state_of(fields: dict[str, str], history: Sequence[tuple[str, JobEvent]]) -> str | None:
    """The view JSON of a view hash as `state` holds it, a lean one completed from the job's events (the rebuild
    compares it with its fold); None when there is none."""
    at = lean_at(fields)
    if at is None:
        return fields.get(keys.VIEW_STATE)
    view = view_of(fields, next((event for entry_id, event in history if entry_id == at), None))
    return encode_view(view).decode() if view is not None else fields[keys.VIEW_LEAN]


async def allowed(redis: Redis) -> bool:
    """Whether the store's switch lets replicas store lean views."""
    return bool(await redis.get(keys.VIEW_FORMAT) == keys.LEAN)


def _entries(reply: object) -> list[tuple[str, dict[str, str]]]:
    # redis-py types stream replies loosely; with decode_responses=True they are str pairs.
    return cast(list[tuple[str, dict[str, str]]], reply)
