"""A conversation's turns in Redis (SPEC S4.3): each ordered session's unfinished turns in create order, the first
holding the session. Every write is one script in the session's slot (`keys.session_partition`).

A turn joins when its create is stored (before the 202), or at its runner's first check if a crash came between.
It leaves when it ends, through its own end: the write that ends it is followed by `release`, and a check that
finds an ended turn first releases it then (a crash between the two), never by a timer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import orjson
from attrs import frozen
from redis.asyncio import Redis

from broker.store import keys
from broker.store.replies import text
from broker.store.scripts import Scripts


@frozen
class Turn:
    """Where a turn stands in its session."""

    holds: bool  #: it holds the session: it may run
    since_ms: int = 0  #: with `holds`: when it got the session
    holder: str | None = None  #: without `holds`: the turn that holds the session
    ahead: int = 0  #: without `holds`: turns ahead of it
    refused: bool = False  #: `join_unless_held` found the session held: the turn took no place


@frozen
class Handover:
    """A turn ended and the next one holds the session now."""

    job_id: str
    place: str | None  #: where it waits to be put back in the line; None: it was not parked


@frozen
class Lineup:
    """A session's turns as the console shows them: unfinished ones in order, then the latest completed."""

    unfinished: tuple[str, ...]  #: the first of the session's unfinished ordered turns, in order; [0] holds it
    more: int  #: unfinished turns after those
    completed: tuple[str, ...]  #: the latest completed turns of its history, oldest first


class SessionStore:
    def __init__(self, redis: Redis, *, retention_ms: int) -> None:
        self._redis = redis
        self._scripts = Scripts(redis)
        self._retention_ms = retention_ms

    async def join(self, session_id: str, job_id: str, now_ms: int) -> Turn:
        """The turn takes its place in the session (a create, once stored, before its 202)."""
        return await self._turn(session_id, job_id, now_ms, "join", "")

    async def join_unless_held(self, session_id: str, job_id: str, now_ms: int) -> Turn:
        """multitask reject: the turn takes the session only if nobody holds it (`refused` else), before its job is
        stored; it is marked as on its way until its `join`."""
        return await self._turn(session_id, job_id, now_ms, "reject", "")

    async def on_its_way(self, session_id: str, job_id: str) -> int | None:
        """When a `join_unless_held` turn took its place, while its job is not stored yet (None: not such a turn)."""
        value = await self._redis.hget(keys.session_state(session_id), f"c:{job_id}")
        return None if value is None else int(text(value))

    async def check(self, session_id: str, job_id: str, now_ms: int, place: str) -> Turn:
        """Before the turn asks Hermes: does it hold the session? If not it is parked, `place` kept for its turn."""
        return await self._turn(session_id, job_id, now_ms, "check", place)

    async def _turn(self, session_id: str, job_id: str, now_ms: int, mode: str, place: str) -> Turn:
        reply = cast(
            list[object],
            await self._scripts.session_turn(keys=self._keys(session_id), args=[job_id, now_ms, mode, place]),
        )
        code = int(cast(int, reply[0]))
        if code == 1:
            return Turn(True, since_ms=int(text(reply[1])))
        if code == 2:
            return Turn(False, holder=text(reply[1]), refused=True)
        return Turn(False, holder=text(reply[1]), ahead=int(cast(int, reply[2])))

    async def release(
        self, session_id: str, job_id: str, now_ms: int, *, completed: bool = False, history: int = 50
    ) -> Handover | None:
        """The turn ended: it leaves the session; the next turn, if this one held the session, gets it. A turn that
        `completed` joins the session's history (the latest `history` are kept)."""
        reply = cast(
            list[object],
            await self._scripts.session_release(
                keys=[*self._keys(session_id), keys.session_history(session_id)],
                args=[job_id, now_ms, self._retention_ms, "1" if completed else "0", max(history, 1)],
            ),
        )
        if not reply:
            return None
        place = text(reply[1])
        return Handover(text(reply[0]), place or None)

    async def history(self, session_id: str, job_id: str, most: int) -> list[str]:
        """The earlier completed turns the turn sends as its history, oldest first: chosen at its first create (the
        latest `most`), the same ones afterwards."""
        reply = await self._scripts.session_history(
            keys=[keys.session_state(session_id), keys.session_history(session_id)],
            args=[job_id, max(most, 1)],
        )
        return [str(item) for item in orjson.loads(text(reply))]

    async def holders(self, session_ids: Sequence[str]) -> dict[str, str | None]:
        """The turn holding each session (None: no ordered turn is unfinished), in one pipeline."""
        unique = list(dict.fromkeys(session_ids))
        if not unique:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for session_id in unique:
                pipe.zrange(keys.session_turns(session_id), 0, 0)
            replies = await pipe.execute()
        return {
            session_id: text(first[0]) if first else None
            for session_id, first in zip(unique, cast(list[list[object]], replies), strict=True)
        }

    async def ahead_of(self, session_id: str, job_id: str) -> list[str]:
        """The session's unfinished turns that joined before `job_id`, oldest first."""
        turns = keys.session_turns(session_id)
        rank = cast(int | None, await self._redis.zrank(turns, job_id))
        if not rank:
            return []
        return [text(item) for item in await self._redis.zrange(turns, 0, rank - 1)]

    async def lineup(self, session_id: str, *, most: int, recent: int) -> Lineup:
        """The session's first `most` unfinished turns and its `recent` latest completed ones (one pipeline)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.zrange(keys.session_turns(session_id), 0, max(most, 1) - 1)
            pipe.zcard(keys.session_turns(session_id))
            pipe.lrange(keys.session_history(session_id), -max(recent, 1), -1)
            first, count, history = await pipe.execute()
        unfinished = tuple(text(item) for item in cast(list[object], first))
        return Lineup(unfinished, max(int(count) - len(unfinished), 0), tuple(text(item) for item in history))

    async def waiting(self) -> int:
        """Turns waiting for their session, over every partition (one pipeline)."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for partition in keys.partitions():
                pipe.hget(keys.sessions(partition), "waiting")
            counts = await pipe.execute()
        return sum(max(int(count or 0), 0) for count in counts)

    def _keys(self, session_id: str) -> list[str]:
        return [
            keys.session_turns(session_id),
            keys.session_state(session_id),
            keys.sessions(keys.session_partition(session_id)),
        ]
