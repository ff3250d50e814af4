"""A session's turns as a state machine on a real Redis (SPEC S4.3): whatever the order of creates, checks and ends,
at most one turn holds a session, turns get it in the order they joined, a parked turn comes back with its place
when its turn comes, and the count of waiting turns matches the parked ones."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from redis.asyncio import Redis

from broker.store import keys
from broker.store.sessions import SessionStore
from tests.conftest import RedisServer

T = TypeVar("T")
SESSIONS = ["s-a", "s-b"]
JOBS = [f"job_{i:032x}" for i in range(8)]
HISTORY = 2  #: completed turns a session's history keeps
MOST = 3  #: unfinished turns a lineup lists


class Turns(RuleBasedStateMachine):
    url = ""  #: the session redis-server, set by the test

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.redis = Redis.from_url(self.url, decode_responses=True)
        self.store = SessionStore(self.redis, retention_ms=600_000)
        self.now = 1_000
        self.joined: dict[str, list[str]] = {session: [] for session in SESSIONS}  # unfinished turns, join order
        self.session_of: dict[str, str] = {}
        self.parked: dict[str, str] = {}  # job -> place
        self.running: dict[str, str] = {}  # session -> the turn whose check found it holds the session
        self.ended: set[str] = set()
        self.completed: dict[str, list[str]] = {session: [] for session in SESSIONS}  # history, oldest first
        self.handed: list[tuple[str, str]] = []  # (job, place) handed back to the line
        self.run(self.redis.flushdb())

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def teardown(self) -> None:
        self.run(self.redis.aclose())
        self.loop.close()

    def fresh(self) -> list[str]:
        return [job for job in JOBS if job not in self.session_of]

    def unfinished(self) -> list[str]:
        return [job for jobs in self.joined.values() for job in jobs]

    @precondition(lambda self: self.fresh())
    @rule(session=st.sampled_from(SESSIONS), data=st.data())
    def create(self, session: str, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(self.fresh()))
        self.now += 1
        self.session_of[job] = session
        self.run(self.store.join(session, job, self.now))
        self.joined[session].append(job)

    @precondition(lambda self: self.unfinished())
    @rule(data=st.data(), place=st.integers(1, 10**6))
    def check(self, data: st.DataObject, place: int) -> None:
        job = data.draw(st.sampled_from(self.unfinished()))
        session = self.session_of[job]
        self.now += 1
        turn = self.run(self.store.check(session, job, self.now, str(place)))
        first = self.joined[session][0]
        assert turn.holds == (job == first), (job, self.joined[session], turn)
        if turn.holds:
            assert self.running.get(session) in (None, job)
            self.running[session] = job
            self.parked.pop(job, None)
        else:
            assert turn.holder == first and turn.ahead == self.joined[session].index(job)
            self.parked.setdefault(job, str(place))

    @precondition(lambda self: self.unfinished())
    @rule(data=st.data(), completed=st.booleans())
    def end(self, data: st.DataObject, completed: bool) -> None:
        job = data.draw(st.sampled_from(self.unfinished()))
        session = self.session_of[job]
        self.now += 1
        held = self.joined[session][0] == job
        handover = self.run(self.store.release(session, job, self.now, completed=completed, history=HISTORY))
        if completed:
            self.completed[session] = [*self.completed[session], job][-HISTORY:]
        self.joined[session].remove(job)
        self.parked.pop(job, None)
        self.ended.add(job)
        if self.running.get(session) == job:
            del self.running[session]
        if held and self.joined[session]:
            following = self.joined[session][0]
            assert handover is not None and handover.job_id == following
            assert handover.place == self.parked.get(following)
            if handover.place is not None:
                self.handed.append((following, handover.place))
        else:
            assert handover is None

    @precondition(lambda self: self.ended)
    @rule(data=st.data())
    def an_ended_turn_ends_again(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(sorted(self.ended)))
        assert self.run(self.store.release(self.session_of[job], job, self.now)) is None

    @invariant()
    def one_holder_per_session_in_join_order(self) -> None:
        holders = self.run(self.store.holders(SESSIONS))
        for session in SESSIONS:
            expected = self.joined[session][0] if self.joined[session] else None
            assert holders[session] == expected

    @invariant()
    def the_lineup_is_the_join_order_and_the_latest_completed(self) -> None:
        for session in SESSIONS:
            lineup = self.run(self.store.lineup(session, most=MOST, recent=HISTORY))
            assert list(lineup.unfinished) == self.joined[session][:MOST]
            assert lineup.more == max(len(self.joined[session]) - MOST, 0)
            assert list(lineup.completed) == self.completed[session]

    @invariant()
    def the_waiting_count_is_the_parked_turns(self) -> None:
        assert self.run(self.store.waiting()) == len(self.parked)

    @invariant()
    def an_ended_session_leaves_no_key(self) -> None:
        for session in SESSIONS:
            if not self.joined[session]:
                assert not self.run(self.redis.exists(keys.session_turns(session), keys.session_state(session)))


def test_a_sessions_turns_under_any_sequence_of_creates_checks_and_ends(redis_server: RedisServer) -> None:
    Turns.url = redis_server.url
    run_state_machine_as_test(Turns, settings=settings(max_examples=60, stateful_step_count=40, deadline=None))
