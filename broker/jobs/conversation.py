"""A conversation's turns (SPEC S4.3): jobs that share a `session_id` run one at a time, in create order, across
every replica and upstream. The rules are pure (`ordered`, `waits`, `session_hold`); `Conversations` does the IO.

A turn of an ordered session joins the session when it is created. Before its runner asks Hermes for a run, it
checks that it holds the session; a turn that does not is parked: out of the admission line (it holds no slot and
keeps no other job waiting), remembered with its place there. When the turn holding the session ends, the next
one gets it and goes back to that place. A parked turn's runner also looks again now and then (the schedule wakes
it), so a crash between a turn's end and its release delays the next turn, never loses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import orjson
from attrs import frozen

from broker.events import HoldReason, JobCreated, JobStatus
from broker.hermes.client import HermesClient
from broker.hermes.fleet import ClientOf
from broker.hermes.models import Accepted, HermesRun, NotFound, Rejected
from broker.ids import upstream_key
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
#: A `reject` turn takes its place before its job is stored; a holder without a job is taken for one whose create
#: died only this long after it took its place (its create has long been answered or failed by then).
ON_ITS_WAY_MS = 60_000
#: How long the end of a turn whose create answer was lost waits for its run, found and stopped, to settle; and
#: when its runner looks again if Hermes did not answer.
SETTLE_WAIT_S = 5.0
ANSWER_RECHECK_MS = 2_000

Enter = Callable[[str, str], Awaitable[None]]  #: puts a waiting job back in the admission line at its place
Lost = Callable[[str | None, int], Awaitable[bool]]  #: has the upstream answered nothing for HERMES_UPSTREAM_LOST?


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

    def __init__(
        self,
        sessions: SessionStore,
        jobs: JobStore,
        enter: Enter,
        *,
        history_turns: int = 50,
        client_of: ClientOf | None = None,
        lost: Lost | None = None,
    ) -> None:
        self.sessions = sessions
        self._jobs = jobs
        self._enter = enter
        self._history_turns = history_turns  #: RUNS_SESSION_HISTORY_TURNS
        self._client_of = client_of  #: the upstreams' clients: a turn whose create answer was lost is looked up there
        self._lost = lost
        self._log = get_logger(type(self))

    async def join(self, view: JobView, now_ms: int) -> None:
        """A new turn takes its place in its session (before its create is answered)."""
        if ordered(view) and not view.status.terminal:
            assert view.session_id is not None
            await self.sessions.join(view.session_id, view.job_id, now_ms)

    async def take_unless_held(self, session_id: str, job_id: str, now_ms: int) -> str | None:
        """multitask reject: the new turn takes the session, before its job is stored, unless an unfinished turn
        holds it: that turn is answered (ended holders are released on the way). One script decides, so two rejecting
        creates of an idle session never both get it."""
        holder: str | None = None
        for _ in range(MAX_REPAIRS):
            turn = await self.sessions.join_unless_held(session_id, job_id, now_ms)
            holder = turn.holder
            if not turn.refused or holder is None or not await self._repaired(session_id, holder, now_ms):
                return holder if turn.refused else None
        return holder

    async def withdraw(self, session_id: str, job_id: str, now_ms: int) -> None:
        """A turn that took its session (multitask reject) but whose job was not stored gives the session back."""
        await self._release(session_id, job_id, now_ms)

    async def check(self, view: JobView, now_ms: int, place: str) -> Turn:
        """Does the turn hold its session? If not it is parked, with `place` to go back to."""
        assert view.session_id is not None
        turn = await self.sessions.check(view.session_id, view.job_id, now_ms, place)
        for _ in range(MAX_REPAIRS):
            if turn.holds or turn.holder is None or not await self._repaired(view.session_id, turn.holder, now_ms):
                return turn
            turn = await self.sessions.check(view.session_id, view.job_id, now_ms, place)
        return turn

    async def ended(self, view: JobView, now_ms: int, *, look_up: bool = True) -> bool:
        """The turn ended: the next one of its session gets it, back in the line at its place. A turn whose last
        create got no answer may have a run live on Hermes: it keeps the session until Hermes answered for that run
        (it is looked up and stopped; not with `look_up` off, then a later check does) or its upstream is lost.
        False: it still holds the session for that reason, and is to be looked at again."""
        if not ordered(view) or not view.status.terminal:
            return True
        assert view.session_id is not None
        if view.unanswered_on is not None and not (look_up and await self._answered(view, now_ms)):
            return False
        await self._release(view.session_id, view.job_id, now_ms, completed=view.status is JobStatus.COMPLETED)
        return True

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
        if snapshot is None:
            on_its_way = await self.sessions.on_its_way(session_id, holder)
            if on_its_way is not None and now_ms - on_its_way < ON_ITS_WAY_MS:
                return False  # a rejecting create between its place and its job
        elif not snapshot.view.status.terminal:
            return False
        elif snapshot.view.unanswered_on is not None and not await self._answered(snapshot.view, now_ms):
            return False
        self._log.info("Released the session of a turn that had ended.", extra={"job": holder, "session": session_id})
        completed = snapshot is not None and snapshot.view.status is JobStatus.COMPLETED
        await self._release(session_id, holder, now_ms, completed=completed)
        return True

    async def _answered(self, view: JobView, now_ms: int) -> bool:
        """Has Hermes answered for the run the turn's last create may have started? Its create is sent again with
        the same Idempotency-Key: a run it started is answered (and stopped, and awaited until it settled), else
        Hermes says no run came of it. True too once its upstream is lost (SPEC S10)."""
        if self._client_of is None:
            return True
        client = self._client_of(view.unanswered_on)
        body = await self.with_history(view, await self._jobs.created_event(view.job_id))
        key = upstream_key(view.job_id, view.attempt)
        outcome = await client.create(body, idempotency_key=key, session_key=view.session_key)
        if isinstance(outcome, Accepted):
            await client.stop(outcome.run_id)
            return await self._settles(client, outcome.run_id)
        if isinstance(outcome, Rejected):
            return True  # Hermes refused that body outright: no run came of it
        return self._lost is not None and await self._lost(view.unanswered_on, now_ms)

    @staticmethod
    async def _settles(client: HermesClient, run_id: str) -> bool:
        deadline = asyncio.get_running_loop().time() + SETTLE_WAIT_S
        while True:
            run = await client.get(run_id)
            if isinstance(run, NotFound) or (isinstance(run, HermesRun) and run.terminal):
                return True
            if asyncio.get_running_loop().time() >= deadline:
                return False  # a later check looks again
            await asyncio.sleep(0.1)

    async def _release(self, session_id: str, job_id: str, now_ms: int, *, completed: bool = False) -> None:
        handover = await self.sessions.release(
            session_id, job_id, now_ms, completed=completed, history=self._history_turns
        )
        if handover is not None and handover.place is not None:
            await self._enter(handover.job_id, handover.place)
