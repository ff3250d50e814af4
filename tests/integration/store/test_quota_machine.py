"""Live quotas (SPEC S4.4) as a state machine on a real Redis: two replicas' passes grant the heads of a line, take
their keys' live runs or hold them, release runs, give grants back (a refusal) and wake held keys in any order, while
settles correct a key's turn (its next job placed earlier, SPEC S4.2 "What a turn costs"). Whatever happens, a key's
live runs never pass its quota, each key's jobs start in their arrival order, no job is lost, a key with room gets
its held jobs back, and only a job its quota held starts its wait for Hermes again when taken."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from redis.asyncio import Redis

from broker.admission.quotas import Quota, Quotas
from broker.store import keys
from broker.store.quota import QuotaStore
from tests.conftest import RedisServer

T = TypeVar("T")
LIMITS = {"a": 1, "b": 2, "c": 0}  #: 0: no live quota
QUOTAS = Quotas(keys=tuple((key, Quota(live=limit or None, waiting=100)) for key, limit in LIMITS.items()))
BAND = 2**52  #: first attempts' places are in a priority band (a resubmit's, ahead of them, is never held for order)
JOBS = [(f"job_{i:02d}", "abc"[i % 3 if i % 5 else 0], BAND + i + 1) for i in range(15)]  #: (job, key, place)
TTL_MS = 60_000


class Quotas2(RuleBasedStateMachine):
    url = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.redis = Redis.from_url(self.url, decode_responses=True)
        self.stores = [QuotaStore(self.redis, QUOTAS), QuotaStore(self.redis, QUOTAS)]
        self.now = 1_000_000
        self.key = {job: key for job, key, _ in JOBS}
        self.arrival = {job: i for i, (job, _, _) in enumerate(JOBS)}
        self.place = {job: place for job, _, place in JOBS}  #: its place in the line, as last given
        self.waiting = [job for job, _, _ in JOBS]  #: never granted, in arrival order: each key's first is its front
        self.back: set[str] = set()  #: sent back to the line (woken, or a live run's grant given back)
        self.live: dict[str, int] = {}  #: job -> the replica that counted it
        self.was_held: set[str] = set()  #: held since its last grant, or handed back (its wait begins again)
        self.done: set[str] = set()
        self.started: list[str] = []
        self.run(self.redis.flushdb())

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def teardown(self) -> None:
        self.run(self.redis.aclose())
        self.loop.close()

    def held(self, key: str) -> set[str]:
        return set(self.run(self.redis.zrange(keys.quota_held(key), 0, -1)))

    def woken(self, key: str) -> set[str]:
        return set(self.run(self.redis.zrange(keys.quota_woken(key), 0, -1)))

    def fronts(self) -> dict[str, str]:
        """Each key's first job never granted: the only one of its new jobs in the line (the rest are parked)."""
        found: dict[str, str] = {}
        for job in self.waiting:
            found.setdefault(self.key[job], job)
        return found

    def line(self) -> set[str]:
        return set(self.fronts().values()) | self.back

    @rule(replica=st.integers(0, 1), most=st.integers(1, 4))
    def a_pass_grants_the_heads(self, replica: int, most: int) -> None:
        heads = sorted(self.line(), key=lambda job: (self.place[job], self.arrival[job]))[:most]
        new = [job for job in heads if job in self.waiting]  #: their keys' next, charged their turns now
        self.back -= set(heads)
        self.waiting = [job for job in self.waiting if job not in heads]
        taking = [(job, self.key[job], str(self.place[job])) for job in heads]
        decided = self.run(self.stores[replica].take(taking, self.now, TTL_MS, new=new))
        for job in heads:
            if job in decided.held:
                self.was_held.add(job)
                continue
            assert (job in decided.waited) == (job in self.was_held), f"{job}: its wait for Hermes began again"
            self.was_held.discard(job)
            self.live[job] = replica
            self.started.append(job)

    @precondition(lambda self: self.fronts())
    @rule(data=st.data(), tag=st.integers(1, 40))
    def a_settle_corrects_a_keys_turn(self, data: st.DataObject, tag: int) -> None:
        front = data.draw(st.sampled_from(sorted(self.fronts().values())))
        self.place[front] = BAND + tag

    @precondition(lambda self: self.live)
    @rule(data=st.data(), refused=st.booleans())
    def a_grant_goes_back_to_the_line(self, data: st.DataObject, refused: bool) -> None:
        job = data.draw(st.sampled_from(sorted(self.live)))
        self.run(self.stores[self.live.pop(job)].returned(job, str(self.place[job]), refused=refused))
        self.back.add(job)
        if not refused and LIMITS[self.key[job]]:  # a key without a quota is not counted: nothing to mark
            self.was_held.add(job)

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def a_run_settles(self, data: st.DataObject) -> None:
        self.a_run_settles_now(data.draw(st.sampled_from(sorted(self.live))))

    def a_run_settles_now(self, job: str) -> None:
        self.run(self.stores[self.live.pop(job)].release(job))
        self.done.add(job)

    @rule(replica=st.integers(0, 1), ms=st.integers(0, 6_000))
    def a_pass_wakes_held_keys(self, replica: int, ms: int) -> None:
        self.now += ms
        for job, key, place in self.run(self.stores[replica].wake(self.now)):
            assert key == self.key[job]
            self.place[job] = int(float(place))
            self.back.add(job)

    @invariant()
    def no_key_passes_its_live_quota(self) -> None:
        for key, limit in LIMITS.items():
            counted = self.run(self.redis.zcard(keys.quota_live(key)))
            mine = sum(1 for job in self.live if self.key[job] == key)
            assert counted == (mine if limit else 0)  # a key without a live quota is not counted
            assert not limit or mine <= limit

    @invariant()
    def each_keys_jobs_start_in_their_order(self) -> None:
        first = list(dict.fromkeys(self.started))  # a grant given back starts again: its first start counts
        for key in LIMITS:
            order = [self.arrival[job] for job in first if self.key[job] == key]
            assert order == sorted(order), f"{key}'s jobs started in the order {order}"

    @invariant()
    def no_job_is_lost(self) -> None:
        held = set().union(*(self.held(key) | self.woken(key) for key in LIMITS))
        for job, _, _ in JOBS:
            assert job in self.line() or job in self.waiting or job in held or job in self.live or job in self.done
            assert job not in self.live or job not in held

    @invariant()
    def a_key_with_room_gets_its_held_jobs_back_by_the_recheck(self) -> None:
        # a due key is looked at within RECHECK_MS, so after time passes without a release nothing is stranded:
        # every held key is due then (a key without a quota is never held but for order)
        for key in LIMITS:
            if self.held(key) or self.woken(key):
                due = self.run(self.redis.zscore(keys.QUOTA_HELD_KEYS, key))
                assert due is not None and due <= self.now + 5_000


@pytest.mark.timeout(300)  # 5,000 steps, each checked with about 15 Redis round trips: past 60 s on a loaded machine
def test_live_quotas_hold_under_any_interleaving(redis_server: RedisServer) -> None:
    Quotas2.url = redis_server.url
    run_state_machine_as_test(Quotas2, settings=settings(max_examples=100, stateful_step_count=50, deadline=None))


def test_a_key_with_room_gets_every_held_job_back_in_order(redis_server: RedisServer) -> None:
    Quotas2.url = redis_server.url
    machine = Quotas2()
    try:
        for _ in range(6):
            machine.a_pass_grants_the_heads(0, 4)
        machine.a_pass_wakes_held_keys(1, 0)
        for _ in range(100):
            if not (machine.live or machine.line() or any(machine.held(key) | machine.woken(key) for key in LIMITS)):
                break
            for job in sorted(machine.live):
                machine.a_run_settles_now(job)
            machine.a_pass_wakes_held_keys(0, 300)
            machine.a_pass_grants_the_heads(1, 4)
        assert sorted(machine.done) == sorted(job for job, _, _ in JOBS)
        machine.each_keys_jobs_start_in_their_order()
    finally:
        machine.teardown()
