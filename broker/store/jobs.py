"""Job streams and views: create, fenced append, load, read after an id. The only XADD/XRANGE."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from attrs import frozen
from redis.asyncio import Redis

from broker.codec import decode, decode_view, encode, encode_view
from broker.errors import JobNotFound, LeaseLost, StreamConflict
from broker.events import JobCreated, JobEvent
from broker.store import keys
from broker.store.scripts import Scripts, as_strings
from projections.job import JobView, fold

START = "0-0"


@frozen
class Snapshot:
    """A job view and the stream id it was folded up to."""

    view: JobView
    last_id: str


@frozen
class Created:
    snapshot: Snapshot
    created: bool  #: False: the job already existed (an idempotent replay)


class JobStore:
    """Reads and writes job streams; every write is one Lua script, one round trip."""

    def __init__(self, redis: Redis, *, retention_ms: int, takeover_ms: int = 15_000) -> None:
        self._redis = redis
        self._scripts = Scripts(redis)
        self._retention_ms = retention_ms
        self._takeover_ms = takeover_ms  # a job nobody took by then is promoted again (RUNS_LEASE)

    async def create(self, event: JobCreated, view: JobView) -> Created:
        """Store `event` and its view and enqueue the job, unless the job id exists already."""
        reply = as_strings(
            await self._scripts.create_job(
                keys=[keys.events(event.job_id), keys.view(event.job_id), keys.WORK, keys.DUE],
                args=[
                    encode(event),
                    encode_view(view),
                    self._retention_ms,
                    event.job_id,
                    event.at_ms + self._takeover_ms,
                ],
            )
        )
        if reply[0] == "1":
            return Created(Snapshot(view, reply[1]), created=True)
        existing = decode_view(reply[1]) or (await self._refold(event.job_id)).view
        return Created(Snapshot(existing, ""), created=False)

    async def append(
        self,
        job_id: str,
        events: Sequence[JobEvent],
        view: JobView,
        *,
        expected_last_id: str | None,
        lease_token: str | None = None,
        enqueue: bool = False,
    ) -> list[str]:
        """Append `events` with `view` (their fold); raise StreamConflict, LeaseLost or JobNotFound."""
        reply = as_strings(
            await self._scripts.append_events(
                keys=[keys.events(job_id), keys.view(job_id), keys.lease(job_id), keys.WORK],
                args=[
                    expected_last_id or "",
                    lease_token or "",
                    self._retention_ms,
                    encode_view(view),
                    job_id if enqueue else "",
                    *(encode(event) for event in events),
                ],
            )
        )
        match reply[0]:
            case "OK":
                return reply[1:]
            case "CONFLICT":
                raise StreamConflict(job_id, reply[1])
            case "FENCED":
                raise LeaseLost(job_id)
            case _:
                raise JobNotFound(job_id)

    async def load(self, job_id: str) -> Snapshot | None:
        """The stored view, refolded from the stream when this replica cannot decode it."""
        stored = cast(dict[str, str], await self._redis.hgetall(keys.view(job_id)))
        if not stored:
            return None
        view = decode_view(stored.get("state", ""))
        if view is None:
            return await self._refold(job_id)
        return Snapshot(view, stored.get("last_id", START))

    async def read(self, job_id: str, after: str = START, count: int | None = None) -> list[tuple[str, JobEvent]]:
        """Events strictly after `after`, oldest first."""
        entries = await self._redis.xrange(keys.events(job_id), min=f"({after}", max="+", count=count)
        return [(entry_id, decode(fields[keys.EVENT_FIELD])) for entry_id, fields in _entries(entries)]

    async def _refold(self, job_id: str) -> Snapshot:
        history = await self.read(job_id)
        view = fold(event for _, event in history)
        if view is None:
            raise JobNotFound(job_id)
        return Snapshot(view, history[-1][0])


def _entries(reply: object) -> list[tuple[str, dict[str, str]]]:
    # redis-py types stream replies loosely; with decode_responses=True they are str pairs.
    return cast(list[tuple[str, dict[str, str]]], reply)
