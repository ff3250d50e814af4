"""The admission scripts as a state machine on a real Redis (SPEC S4.1): whatever Hermes answers and whenever,
the line keeps arrival order, the limit holds, one probe at a time while Hermes refuses, and no job is lost."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from redis.asyncio import Redis

from broker.admission.pacing import Pacing
from broker.events import HoldReason
from broker.store import keys
from broker.store.admission import AdmissionStore
from tests.conftest import RedisServer

T = TypeVar("T")
JOBS = [f"job_{i:032x}" for i in range(12)]
PACING = Pacing(slot_ttl_ms=5_000, backoff_ms=100, backoff_max_ms=800, quiet_ms=1_000)


class Line(RuleBasedStateMachine):
    url = ""  #: the session redis-server, set by the test

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.redis = Redis.from_url(self.url, decode_responses=True)
        self.store = AdmissionStore(self.redis, PACING)
        self.now = 1_000_000
        self.waiting: dict[str, int] = {}  # job -> place
        self.granted: set[str] = set()  # a create is in flight
        self.running: set[str] = set()  # Hermes accepted it
        self.done: set[str] = set()
        self.refusing = False
        self.retry_at = 0
        self.run(self.redis.flushdb())
        for place, job in enumerate(JOBS, start=1):
            self.run(self.store.enter(job, str(place * 1000)))
            self.waiting[job] = place * 1000

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def teardown(self) -> None:
        self.run(self.redis.aclose())
        self.loop.close()

    def line(self) -> Any:
        return self.run(self.store.state(self.now))

    @rule(ms=st.integers(1, 1_500))
    def time_passes(self, ms: int) -> None:
        # live replicas renew their slots every third of the ttl; time moves less than a ttl per step
        self.run(self.store.hold(self.granted | self.running, self.now, renew_only=True))
        self.now += ms

    @rule(most=st.integers(1, 5))
    def a_replica_admits(self, most: int) -> None:
        before = self.line()
        grants = self.run(self.store.admit(self.now, most))
        # Then the grants are the head of the line, oldest first
        head = sorted(self.waiting, key=self.waiting.__getitem__)[: len(grants.jobs)]
        assert grants.jobs == head
        # and within the limit; while Hermes refuses, one probe at most, and only once it is due
        assert len(grants.jobs) <= max(0, min(most, before.limit - before.live))
        if self.refusing:
            assert len(grants.jobs) <= 1 and (not grants.jobs or self.now >= self.retry_at)
            assert not (grants.jobs and self.granted), "a second create in flight while Hermes refuses"
        for job in grants.jobs:
            del self.waiting[job]
            self.granted.add(job)

    @precondition(lambda self: self.granted)
    @rule(data=st.data())
    def hermes_accepts(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(sorted(self.granted)))
        self.run(self.store.accepted(job, self.now))
        self.granted.discard(job)
        self.running.add(job)
        self.refusing = False

    @precondition(lambda self: self.granted)
    @rule(data=st.data(), reason=st.sampled_from(list(HoldReason)), retry_after=st.none() | st.integers(0, 2_000))
    def hermes_refuses(self, data: st.DataObject, reason: HoldReason, retry_after: int | None) -> None:
        job = data.draw(st.sampled_from(sorted(self.granted)))
        live_others = len(self.granted) + len(self.running) - 1
        before = self.line()
        answer = self.run(
            self.store.refused(
                job, self.now, reason=reason, detail="no", retry_after_ms=retry_after, jitter=0.5, place="0"
            )
        )
        place = int(float(self.run(self.redis.zscore(keys.line(keys.partition_of(job)), job)) or -1))
        assert place == JOBS.index(job) * 1000 + 1000, "back to its own place in the line"
        self.granted.discard(job)
        self.waiting[job] = place
        self.run(self.redis.delete(keys.lease(job)))  # its runner gives the run lease up as it goes back in line
        if reason is HoldReason.BUSY:
            assert answer.limit == max(1, min(before.limit, live_others))  # a 429 teaches N live, never above
        if not self.refusing:
            assert answer.began and answer.retry_at_ms >= self.now + (retry_after or 0)
            self.retry_at = answer.retry_at_ms
        elif answer.retry_at_ms != self.retry_at:
            self.retry_at = answer.retry_at_ms
        self.refusing = True

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def a_run_settles(self, data: st.DataObject) -> None:
        job = data.draw(st.sampled_from(sorted(self.running)))
        self.run(self.store.release(job, freed=True))
        self.running.discard(job)
        self.done.add(job)
        self.refusing = False  # the slot it frees is newer than any refusal

    @invariant()
    def no_job_is_lost_or_twice(self) -> None:
        line = {
            job for partition in keys.partitions() for job in self.run(self.redis.zrange(keys.line(partition), 0, -1))
        }
        live = set(self.run(self.redis.zrange(keys.ADMISSION_LIVE, 0, -1)))
        assert line == set(self.waiting)
        assert live == self.granted | self.running
        assert len(self.waiting) + len(self.granted) + len(self.running) + len(self.done) == len(JOBS)

    @invariant()
    def the_limit_is_at_least_one_and_the_refusal_is_shared(self) -> None:
        line = self.line()
        assert line.limit >= 1
        assert (line.refusing is not None) == self.refusing


@pytest.mark.timeout(300)  # ~50 s here; past the suite's 60 s pytest-timeout stops it mid-example (a "flaky" error)
def test_the_line_under_any_sequence_of_answers(redis_server: RedisServer) -> None:
    Line.url = redis_server.url
    run_state_machine_as_test(Line, settings=settings(max_examples=60, stateful_step_count=40, deadline=None))
