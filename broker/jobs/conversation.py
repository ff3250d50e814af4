"""A conversation's turns (SPEC S4.3): jobs that share a `session_id` run one at a time, in create order, across
every replica and upstream. The rules are pure (`ordered`, `waits`, `session_hold`); `Conversations` does the IO.

A turn of an ordered session joins the session when it is created. Before its runner asks Hermes for a run, it
checks that it holds the session; a turn that does not is parked: out of the admission line (it holds no slot and
keeps no other job waiting), remembered with its place there. When the turn holding the session ends, the next
one gets it and goes back to that place. A parked turn's runner also looks again now and then (the schedule wakes
it), so a crash between a turn's end and its release delays the next turn, never loses it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

import orjson
from attrs import frozen

from broker.events import HoldReason, JobCreated, JobStatus
from broker.logging import get_logger
from broker.store.jobs import JobStore
from broker.store.sessions import SessionStore, Turn
from projections.job import Hold, JobView

#: How often a parked turn's runner looks again (the turn right behind the holder: a crash between the holder's
#: end and its release is noticed then); turns further back look again less often.
RECHECK_MS = 30_000
RECHECK_BEHIND_MS = 300_000
#: Ended holders one check releases at most (each was a crash between an end and its release).
MAX_REPAIRS = 8

Enter = Callable[[str, str], Awaitable[None]]  #: puts a waiting job back in the admission line at its place


@frozen
class SessionTurns:
    """A session's turns side by side (the console's job page): the latest completed, oldest first, then the
    unfinished ordered ones in order, the first holding the session. A turn that expired has no view."""

    session_id: str
    completed: tuple[tuple[str, JobView | None], ...]
    unfinished: tuple[tuple[str, JobView | None], ...]
    more: int  #: unfinished turns after the ones shown


def ordered(view: JobView) -> bool:
    """The job is a turn of an ordered session: it has a `session_id` and its multitask is not `parallel`."""
    return view.session_id is not None and view.scheduling.multitask != "parallel"


def waits(view: JobView) -> bool:
    """The turn must hold its session before Hermes is asked for a run: an ordered turn without a live run that
    is not being stopped (a stopped waiting turn ends without one)."""
    live = view.accepted_attempt == view.attempt and view.hermes_run_id is not None
    return ordered(view) and not view.status.terminal and not live and not view.stop_requested


def session_hold(view: JobView, holder: str, now_ms: int) -> Hold:
    """What a turn waiting for its session shows (SPEC S3.2 `hold`, reason `session`)."""
    detail = f"Waiting for {holder} of session {view.session_id}."
    return Hold(HoldReason.SESSION, view.created_at_ms, max(now_ms, view.created_at_ms), detail)


def recheck_at(turn: Turn, now_ms: int) -> int:
    """When a parked turn's runner looks at its session again."""
    return now_ms + (RECHECK_MS if turn.ahead <= 1 else RECHECK_BEHIND_MS)


class Conversations:
    """The sessions' turns as the service and the runners use them."""

    def __init__(self, sessions: SessionStore, jobs: JobStore, enter: Enter, *, history_turns: int = 50) -> None:
        self.sessions = sessions
        self._jobs = jobs
        self._enter = enter
        self._history_turns = history_turns  #: RUNS_SESSION_HISTORY_TURNS
        self._log = get_logger(type(self))

    async def join(self, view: JobView, now_ms: int) -> None:
        """A new turn takes its place in its session (before its create is answered)."""
        if ordered(view) and not view.status.terminal:
            assert view.session_id is not None
            await self.sessions.join(view.session_id, view.job_id, now_ms)

    async def holder(self, session_id: str, now_ms: int) -> str | None:
        """The unfinished turn that holds the session, if any (ended holders are released on the way)."""
        for _ in range(MAX_REPAIRS):
            holder = (await self.sessions.holders([session_id]))[session_id]
            if holder is None or not await self._repaired(session_id, holder, now_ms):
                return holder
        return holder

    async def check(self, view: JobView, now_ms: int, place: str) -> Turn:
        """Does the turn hold its session? If not it is parked, with `place` to go back to."""
        assert view.session_id is not None
        turn = await self.sessions.check(view.session_id, view.job_id, now_ms, place)
        for _ in range(MAX_REPAIRS):
            if turn.holds or turn.holder is None or not await self._repaired(view.session_id, turn.holder, now_ms):
                return turn
            turn = await self.sessions.check(view.session_id, view.job_id, now_ms, place)
        return turn

    async def ended(self, view: JobView, now_ms: int) -> None:
        """The turn ended: the next one of its session gets it, back in the line at its place."""
        if not ordered(view) or not view.status.terminal:
            return
        assert view.session_id is not None
        await self._release(view.session_id, view.job_id, now_ms, completed=view.status is JobStatus.COMPLETED)

    async def with_history(self, view: JobView, created: JobCreated) -> bytes:
        """The execution body a turn with `session_history` sends: its own, with the session's earlier completed
        turns as `conversation_history` (the same on every attempt)."""
        if not created.session_history or view.session_id is None:
            return created.body.encode()
        turns = await self.sessions.history(view.session_id, view.job_id, self._history_turns)
        messages: list[object] = []
        for turn in turns:
            messages.extend(await self._turn_messages(turn))
        if not messages:  # the session's first completed turn is yet to come: the body as the caller sent it
            return created.body.encode()
        body = orjson.loads(created.body)
        body["conversation_history"] = messages
        return orjson.dumps(body)

    async def _turn_messages(self, job_id: str) -> list[object]:
        """A completed turn as history: its input as the user's (its messages when it gave some), its output as the
        assistant's. A turn that expired since is left out."""
        snapshot = await self._jobs.load(job_id)
        if snapshot is None or snapshot.view.status is not JobStatus.COMPLETED:
            return []
        asked = orjson.loads((await self._jobs.created_event(job_id)).body).get("input")
        messages: list[object] = list(asked) if isinstance(asked, list) else [{"role": "user", "content": asked}]
        if snapshot.view.output is not None:
            messages.append({"role": "assistant", "content": snapshot.view.output})
        return messages

    async def turns(self, session_id: str, *, most: int, recent: int) -> SessionTurns:
        """The session's first `most` unfinished turns and its `recent` latest completed ones, with their views."""
        lineup = await self.sessions.lineup(session_id, most=most, recent=recent)
        ids = [*lineup.completed, *lineup.unfinished]
        views = dict(zip(ids, await self._jobs.views(ids), strict=True))
        return SessionTurns(
            session_id,
            tuple((job_id, views[job_id]) for job_id in lineup.completed),
            tuple((job_id, views[job_id]) for job_id in lineup.unfinished),
            lineup.more,
        )

    async def ahead_of(self, view: JobView) -> list[str]:
        """The unfinished turns of the job's session that came before it."""
        return await self.sessions.ahead_of(view.session_id, view.job_id) if ordered(view) and view.session_id else []

    async def holders(self, views: Sequence[JobView]) -> dict[str, str | None]:
        """The holder of the session of each ordered waiting view (one pipeline), by session."""
        return await self.sessions.holders([view.session_id for view in views if view.session_id and ordered(view)])

    async def _repaired(self, session_id: str, holder: str, now_ms: int) -> bool:
        """True when the holder had ended (or expired) and is released now: it crashed between its end and its
        release."""
        snapshot = await self._jobs.load(holder)
        if snapshot is not None and not snapshot.view.status.terminal:
            return False
        self._log.info("Released the session of a turn that had ended.", extra={"job": holder, "session": session_id})
        completed = snapshot is not None and snapshot.view.status is JobStatus.COMPLETED
        await self._release(session_id, holder, now_ms, completed=completed)
        return True

    async def _release(self, session_id: str, job_id: str, now_ms: int, *, completed: bool = False) -> None:
        handover = await self.sessions.release(
            session_id, job_id, now_ms, completed=completed, history=self._history_turns
        )
        if handover is not None and handover.place is not None:
            await self._enter(handover.job_id, handover.place)
