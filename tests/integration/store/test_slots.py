"""One slot per atomic write (DESIGN §6, SPEC S9): every script and MULTI of the store, run against a real
Redis in cluster mode, where a write whose KEYS span two hash slots fails with CROSSSLOT.

The node owns every slot and the store runs through the broker's cluster client (REDIS_CLUSTER=true), so
the only thing that can fail is the slot rule itself (the node answers CROSSSLOT). Static checks add that
the keys of a job write and of the admission scripts map to one slot each, that every script's header
names its keys and their slot, and that every script of the store is exercised here. (On a single Redis
the job write also takes its fairness key's turn in the same script: no slots there.)
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
import redis as sync_redis
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio import Redis
from redis.crc import key_slot
from redis.exceptions import ClusterCrossSlotError

from broker.admission import fair
from broker.admission.cost import CostSettings
from broker.admission.pacing import Pacing
from broker.admission.quotas import Bound, Quota, Quotas
from broker.events import HoldReason, JobCreated, JobFinished, JobStatus, Scheduling, StopRequested
from broker.store import keys, quota_view, scripts
from broker.store.admission import AdmissionStore
from broker.store.board import BoardStore, OutboxEntry
from broker.store.callbacks import CallbackStore, CallbackWrite
from broker.store.connection import connect
from broker.store.cost_store import CostStore, Step
from broker.store.deltas import DeltaSchedule
from broker.store.fair_top import FairTopRepair
from broker.store.jobs import BoardWrite, JobStore
from broker.store.leases import Leases
from broker.store.listing import IndexRepair, Listing
from broker.store.quota import QuotaStore
from broker.store.rebuild import RebuildStore, Replacement
from broker.store.scripts import NAMES, source
from broker.store.sessions import SessionStore
from broker.store.upstream_admission import slots_of
from broker.store.usage import UsageStore
from broker.store.usage import encode as encode_fact
from broker.upstreams import build
from broker.upstreams.health import Heard
from projections.board import BoardState
from projections.job import apply, fold
from projections.usage import Used
from tests.conftest import RedisServer

Operation = Callable[[Redis], Awaitable[object]]


@pytest.fixture(scope="module")
def cluster_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    directory: Path = tmp_path_factory.mktemp("cluster-node")
    server = RedisServer(directory, "--cluster-enabled", "yes", "--cluster-config-file", str(directory / "nodes.conf"))
    server.start()
    client = sync_redis.Redis(port=server.port)
    client.execute_command("CLUSTER", "ADDSLOTS", *range(16384))
    deadline = time.monotonic() + 10
    while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
        assert time.monotonic() < deadline, "the one-node cluster did not come up"
        time.sleep(0.05)
    client.close()
    yield server
    server.stop()


@pytest.fixture
async def node(cluster_node: RedisServer) -> AsyncIterator[Redis]:
    """The broker's cluster client (REDIS_CLUSTER=true) on the one-node cluster: the code paths of a cluster."""
    plain = Redis(port=cluster_node.port)
    await plain.flushall()
    await plain.aclose()
    client = connect(cluster_node.url, cluster=True)
    yield client
    await client.aclose()


JOB = "job_" + "a" * 32


async def _create(redis: Redis) -> None:
    event = JobCreated(job_id=JOB, at_ms=1_000, body='{"input":"x"}', fingerprint="f")
    view = apply(None, event)
    assert view is not None
    await JobStore(redis, retention_ms=60_000).create(event, view)


async def _create_keyed(redis: Redis) -> None:
    scheduling = Scheduling(priority=1, fairness_key="team-a", fairness_weight=2.5)
    event = JobCreated(job_id=JOB, at_ms=1_000, body='{"input":"x"}', fingerprint="f", scheduling=scheduling)
    view = apply(None, event)
    assert view is not None
    await JobStore(redis, retention_ms=60_000).create(event, view)


async def _create_bounded(redis: Redis) -> None:
    """A create under a key's waiting quota and a bound on all (SPEC S4.4): the other partitions read first, then
    the job write checks its own."""
    store = JobStore(redis, retention_ms=60_000)
    for number, job_id in enumerate((JOB, "job_" + "b" * 32)):
        scheduling = Scheduling(fairness_key="team-a")
        event = JobCreated(job_id=job_id, at_ms=1_000, body="{}", fingerprint=str(number), scheduling=scheduling)
        view = apply(None, event)
        assert view is not None
        await store.create(event, view, bound=Bound(key=5, all=5))
    assert await redis.hget(keys.fair(keys.partition_of(JOB)), "n:team-a") is not None


def _admission(redis: Redis) -> AdmissionStore:
    return AdmissionStore(redis, Pacing())


async def _admit(redis: Redis) -> object:
    return await _admission(redis).admit(1_000, 5)


async def _accepted(redis: Redis) -> object:
    return await _admission(redis).accepted(JOB, 1_000)


async def _refused(redis: Redis) -> object:
    store = _admission(redis)
    return await store.refused(
        JOB, 1_000, reason=HoldReason.BUSY, detail="Full.", retry_after_ms=1_000, jitter=0.5, place="1"
    )


SECOND = "hermes-2:8642/agent"  #: an upstream past the first (SPEC S10): its admission keyed by its name


def _fleet(redis: Redis) -> AdmissionStore:
    upstreams = build(["http://hermes-1:8642", f"http://{SECOND}"], None, [0, 3])
    return AdmissionStore(redis, Pacing(), upstreams=slots_of(upstreams))


async def _second_upstream(redis: Redis) -> object:
    store = _fleet(redis)
    await store.accepted(JOB, 1_000, upstream=SECOND)
    await store.refused(
        JOB, 1_000, reason=HoldReason.BUSY, detail="Full.", retry_after_ms=1_000, jitter=0.5, place="1", upstream=SECOND
    )
    await store.hold([JOB], 1_000, upstream=SECOND)
    await store.release(JOB, freed=True, upstream=SECOND)
    await store.requeue(JOB, "1", upstream=SECOND)
    return await store.state(1_000)


async def _release(redis: Redis) -> object:
    return await _admission(redis).release(JOB, freed=True)


async def _health(redis: Redis) -> object:
    health = _fleet(redis).health
    await health.report(SECOND, Heard(answered_ms=1_000, failing_since_ms=2_000, failed_ms=3_000))
    await health.claim_probe(SECOND, 3_000, 4_000)
    await health.orphan(SECOND, "run_1", 3_000)
    await health.settled(SECOND, "run_1")
    return await health.read(SECOND)


async def _requeue(redis: Redis) -> object:
    return await _admission(redis).requeue(JOB, "1")


async def _lease(redis: Redis) -> object:
    return await Leases(redis, lease_ms=1_000).acquire(JOB, "token", 1_000)


async def _append(redis: Redis) -> object:
    await _create(redis)
    store = JobStore(redis, retention_ms=60_000)
    snapshot = await store.load(JOB)
    assert snapshot is not None
    event = JobCreated(job_id=JOB, at_ms=1_000, body='{"input":"x"}', fingerprint="f")
    board = BoardWrite(state=BoardState(), report=b"{}", at_ms=2, state_change=True, expire_at_ms=10**13, now_ms=2)
    return await store.append(JOB, [event], snapshot.view, expected_last_id=None, board=board, due_at=5)


async def _callbacks(redis: Redis) -> object:
    """A job write owing a callback, a claim of every partition's schedule, an attempt's outcome (SPEC S5.8)."""
    await _create(redis)
    store = JobStore(redis, retention_ms=60_000)
    snapshot = await store.load(JOB)
    assert snapshot is not None
    finished = JobFinished(job_id=JOB, at_ms=2_000, status=JobStatus.COMPLETED)
    owed = CallbackWrite(url="https://h/", add=((f"{JOB}:job.completed:1", b"{}"),), now_ms=2_000, ttl_ms=60_000)
    view = fold([finished], snapshot.view)
    assert view is not None
    await store.append(JOB, [finished], view, expected_last_id=None, before=snapshot.view, callback=owed)
    callbacks = CallbackStore(redis)
    assert await callbacks.claim(3_000, 1_000, 10) == [JOB]
    first = await callbacks.first_owed(JOB)
    assert first is not None
    await callbacks.record(first, "retry", error="HTTP 503", retry_at_ms=4_000, now_ms=3_000)
    await callbacks.record(first, "delivered", now_ms=4_000)
    await callbacks.idle(JOB, 5_000)
    return await callbacks.states([(JOB, "https://h/")])


async def _renew(redis: Redis) -> object:
    leases = Leases(redis, lease_ms=1_000)
    await leases.acquire(JOB, "token", 1_000)
    return await leases.renew(JOB, "token", 1_100)


async def _release_lease(redis: Redis) -> object:
    leases = Leases(redis, lease_ms=1_000)
    await leases.acquire(JOB, "token", 1_000)
    return await leases.release(JOB, "token", due_at_ms=2_000, enqueue=True)


async def _promote(redis: Redis) -> object:
    leases = Leases(redis, lease_ms=1_000)
    await leases.acquire(JOB, "token", 1_000)
    return await leases.promote_due(10_000)


async def _enter(redis: Redis) -> object:
    await _create(redis)
    store = _admission(redis)
    await _admit_with_a_waiting_job(redis)  # off the line (and off its key's count)
    return await store.enter(JOB, "1")  # back in it, counted again


async def _fair_clear(redis: Redis) -> object:
    await _create(redis)
    store = _admission(redis)
    await _admit_with_a_waiting_job(redis)
    await redis.hset(keys.fair(keys.partition_of(JOB)), "n:drift", "3")  # type: ignore[misc]
    return await store.admit(2_000, 5)  # a full read sees the empty line with counts: clears them


async def _fair_clear_parked(redis: Redis) -> object:
    """admission_fair_clear.lua of a cost-aware pass (the parked jobs' zset among its KEYS): a partition whose line
    is empty keeps its counts while a job is parked there, and clears them when none is."""
    store = AdmissionStore(redis, Pacing(pinned=5), cost=(CostSettings(), 60_000))
    partition = keys.partition_of(JOB)
    await redis.zadd(keys.parked(partition), {JOB: 2.0**52})
    await redis.hset(keys.fair(partition), "n:drift", "3")  # type: ignore[misc]
    await store.admit(2_000, 5)  # a full read sees the empty line: the parked job keeps the counts
    assert await redis.hget(keys.fair(partition), "n:drift") == "3"
    await redis.delete(keys.parked(partition))
    store = AdmissionStore(redis, Pacing(pinned=5), cost=(CostSettings(), 60_000))
    await store.admit(3_000, 5)
    assert not await redis.exists(keys.fair(partition))
    return True


async def _stop_waiting(redis: Redis) -> object:
    await _create(redis)
    store = JobStore(redis, retention_ms=60_000)
    snapshot = await store.load(JOB)
    assert snapshot is not None
    stop = StopRequested(job_id=JOB, at_ms=1_100)
    finished = JobFinished(job_id=JOB, at_ms=1_100, status=JobStatus.CANCELLED, error_code="stopped")
    view = fold([stop, finished], snapshot.view)
    assert view is not None and view.status.terminal
    return await store.append(JOB, [stop, finished], view, expected_last_id=None, before=snapshot.view)


async def _admit_with_ties(redis: Redis) -> object:
    store = JobStore(redis, retention_ms=60_000)
    for i, key in enumerate(("u1", "u2", "u3")):  # one start tag: keys without a turn, before any grant
        event = JobCreated(
            job_id=f"job_{i:032x}", at_ms=1_000 + i, body="{}", fingerprint="f", scheduling=Scheduling(fairness_key=key)
        )
        view = apply(None, event)
        assert view is not None
        await store.create(event, view)
    grants = await _admission(redis).admit(2_000, 5)  # ties among the heads: admission_ties.lua per partition
    assert grants.jobs == ["job_" + "0" * 32, f"job_{1:032x}"]
    return grants


async def _admit_with_a_waiting_job(redis: Redis) -> object:
    await _create(redis)  # enters the job's partition line
    grants = await _admission(redis).admit(1_000, 5)  # reserve ({adm}), claim ({pN}), grant+give back ({adm})
    assert grants.jobs == [JOB]
    return grants


async def _replace_view(redis: Redis) -> object:
    await _create(redis)
    store = RebuildStore(redis)
    stored = await store.read(JOB)  # a MULTI over the job's keys
    assert stored.last_id is not None
    replacement = Replacement(last_id=stored.last_id, seen_view_last_id=stored.view["last_id"], view=b"{}")
    return await store.replace(JOB, replacement)


async def _remove_deltas(redis: Redis) -> object:
    await _create(redis)
    await redis.zadd(keys.deltas(keys.partition_of(JOB)), {JOB: 1})
    return await DeltaSchedule(redis).remove(await DeltaSchedule(redis).due(10), 10)


async def _line_state(redis: Redis) -> object:
    await _create_keyed(redis)
    for partition in (keys.partition_of(JOB), 0):  # one key listed from the hash, one from the top zset
        await redis.hset(keys.fair(partition), mapping={f"n:k{i}": "1" for i in range(30)})  # type: ignore[misc]
        await redis.zadd(keys.fair_top(partition), {f"k{i}": 1 for i in range(30)})
    return await _admission(redis).state(1_000)


async def _fair_top_repair(redis: Redis) -> object:
    await _create_keyed(redis)
    await redis.delete(keys.fair_top(keys.partition_of(JOB)))
    return await FairTopRepair(redis, scripts.Scripts(redis).fair_top_repair).all()


async def _board_ack(redis: Redis) -> object:
    return await BoardStore(redis).ack(JOB, 1, 2)


async def _board_promote(redis: Redis) -> object:
    store = BoardStore(redis)
    await store.schedule(JOB, 1)
    return await store.promote_due(10)


async def _outbox_entries(redis: Redis) -> list[OutboxEntry]:
    store = BoardStore(redis)
    await store.ensure_group()
    await redis.xadd(keys.board_outbox(keys.partition_of(JOB)), {"job": JOB, "at": "1"})
    return await store.read_outbox("c1", 10, 10)


async def _board_outbox_done(redis: Redis) -> object:
    entries = await _outbox_entries(redis)
    assert len(entries) == 1
    return await BoardStore(redis).done(entries)


async def _board_handover(redis: Redis) -> object:
    return await BoardStore(redis).handover(JOB, await _outbox_entries(redis))


async def _release_lock(redis: Redis) -> object:
    store = BoardStore(redis)
    await store.acquire(keys.board_lock(JOB), "t", 1_000)
    return await store.release(keys.board_lock(JOB), "t")


async def _reindex(redis: Redis) -> object:
    event = JobCreated(job_id=JOB, at_ms=1_000, body='{"input":"x"}', fingerprint="f")
    view = apply(None, event)
    assert view is not None
    await redis.hset(keys.view(JOB), "last_id", "1-1")  # type: ignore[misc]
    return await IndexRepair(redis).job(view, "1-1", write=True)


async def _list_statuses(redis: Redis) -> object:
    return await Listing(redis, retention_ms=60_000).page([JobStatus.QUEUED, JobStatus.RUNNING], 10, None, 2_000)


async def _list_one_status(redis: Redis) -> object:
    return await Listing(redis, retention_ms=60_000).page([JobStatus.QUEUED], 10, None, 2_000)


async def _session_turns(redis: Redis) -> object:
    store = SessionStore(redis, retention_ms=60_000)
    await store.join("s-1", JOB, 1_000)
    await store.check("s-1", "job_2", 1_001, "5")
    await store.history("s-1", "job_2", 10)
    return await store.release("s-1", JOB, 1_002, completed=True)


async def _usage(redis: Redis) -> object:
    await _create(redis)
    store = JobStore(redis, retention_ms=60_000)
    snapshot = await store.load(JOB)
    assert snapshot is not None
    event = JobCreated(job_id=JOB, at_ms=1_000, body='{"input":"x"}', fingerprint="f")
    fact = Used(marker=f"{JOB}:1:a", key="team-a", at_ms=1_000, runs_started=1)
    await store.append(JOB, [event], snapshot.view, expected_last_id=None, usage=[(1_000, encode_fact(fact))])
    usage = UsageStore(redis, retention_ms=60_000)
    pending = await usage.pending()
    other_hour = Used(marker=f"{JOB}:end", key="team-a", at_ms=4_000_000, runs_completed=1, hermes_ms=5)
    assert await usage.count([fact, other_hour]) == [True, True]  # one usage_record.lua per hour
    await usage.clear(pending)
    return await usage.totals(["team-a"], [0, 3600])


async def _usage_replace(redis: Redis) -> object:
    usage = UsageStore(redis, retention_ms=60_000)
    await usage.count([Used(marker="j:1:a", key="team-a", at_ms=1_000, runs_started=1)])
    return await usage.replace(0, {"team-a": (1, 1, 0, 0, 5, 0, 0, 0)}, ["j:1:a", "j:end"])


async def _quotas(redis: Redis) -> object:
    quotas = Quotas(keys=(("team{a}", Quota(live=1, waiting=9)), ("b", Quota(live=2, tokens=10, window="1h"))))
    store = QuotaStore(redis, quotas, UsageStore(redis, retention_ms=60_000))
    held = await store.take([("job_1", "team{a}", "10"), ("job_2", "team{a}", "11"), ("job_3", "b", "12")], 1_000, 500)
    assert held.held == {"job_2"}
    await store.renew(["job_1", "job_3"], 1_100, 500)
    await store.release("job_1")
    await store.returned("job_3", "12", refused=True)
    await store.hold("job_4", "b", 1_200, 500)
    assert sorted(await store.wake(1_300)) == [("job_2", "team{a}", "11"), ("job_3", "b", "12")]
    await store.forget([("job_2", "team{a}")])
    await store.budgets.counted([Used(marker="job_3:end", key="b", at_ms=1_000, total_tokens=5)])
    await quota_view.held(store, Bound(key=9, all=99), "team{a}")
    return await quota_view.figures(store, 1_300)


async def _return_woken(redis: Redis) -> object:
    """A held job of the empty key sent back to the line: admission_enter.lua in its `woken` mode (the job's lease
    among its KEYS), after quota_wake.lua."""
    await _create(redis)
    quota = QuotaStore(redis, Quotas(keys=(("", Quota(live=1)),)))
    store = AdmissionStore(redis, Pacing(), quota=quota)
    await quota.take([("job_other", "", str(2**52)), (JOB, "", str(2**52 + 1))], 1_000, 500)
    await quota.release("job_other")
    await store._return_woken(1_100)
    place = await redis.zscore(keys.line(keys.partition_of(JOB)), JOB)
    assert place is not None  # it entered the line
    return place


async def _cost_turns(redis: Redis) -> object:
    """A key's cost-aware turns (SPEC S4.2 "What a turn costs"): two creates (a front, a parked job), a pass's key
    step, its front placed, the heads read, the settle; each script in its own slot (the key's, or the job's)."""
    store = CostStore(redis, CostSettings(), 60_000)
    second = "job_" + "b" * 32
    await store.enter(JOB, "team{a}", 3, 1.0, 1_000, 0, 0)
    placed = await store.enter(second, "team{a}", 3, 1.0, 1_001, 0, 0)
    await redis.zadd(keys.parked(keys.partition_of(second)), {second: fair.score(3, placed.tag)})
    step = await store.step("team{a}", 3, 1.0, 0, [Step(JOB)])
    assert step.front is not None and step.front.placed.job == second
    assert await store.promote([step.front]) == [1]
    heads = await store.heads([keys.partition_of(second)], 10)
    assert heads[keys.partition_of(second)].fronts[0][0] == second
    done = await store.settle(JOB, 1, "team{a}", 3, 1.0, 5_000.0, 0, 2_000)
    assert done.at_v and done.units == 5_000  # a newcomer's run: the newcomers' pacing learns it
    assert (await store.fresh(5_000.0)).runs == 1
    return await store.unpark(keys.partition_of(second))


async def _cost_create_and_stop(redis: Redis) -> object:
    """Creates under ADMISSION_FAIRNESS_COST time (fair_turn_cost.lua, then append_events.lua with the parked jobs or
    the fronts) and a stop of the front (append_events.lua leaving the line and the fronts, fair_next.lua `left`,
    fair_promote.lua of the key's next job)."""
    store = JobStore(redis, retention_ms=60_000, cost=CostSettings())
    second = "job_" + "b" * 32
    for n, job_id in enumerate((JOB, second)):
        event = JobCreated(
            job_id=job_id, at_ms=1_000 + n, body="{}", fingerprint=str(n), scheduling=Scheduling(fairness_key="t{a}")
        )
        view = apply(None, event)
        assert view is not None
        await store.create(event, view)
    assert await redis.zscore(keys.parked(keys.partition_of(second)), second) is not None
    snapshot = await store.load(JOB)
    assert snapshot is not None
    stop = StopRequested(job_id=JOB, at_ms=1_100)
    finished = JobFinished(job_id=JOB, at_ms=1_100, status=JobStatus.CANCELLED, error_code="stopped")
    view = fold([stop, finished], snapshot.view)
    assert view is not None
    await store.append(JOB, [stop, finished], view, expected_last_id=None, before=snapshot.view)
    place = await redis.zscore(keys.line(keys.partition_of(second)), second)
    assert place is not None  # the key's next job is its front
    return place


async def _cost_pass(redis: Redis) -> object:
    """A pass under ADMISSION_FAIRNESS_COST time: line_heads.lua per partition, admission_claim.lua from the line
    and from the parked jobs, fair_next.lua per key, fair_promote.lua per next front, in rounds."""
    store = JobStore(redis, retention_ms=60_000, cost=CostSettings())
    jobs = [f"job_{n:032x}" for n in range(3)]
    for n, job_id in enumerate(jobs):
        scheduling = Scheduling(fairness_key="t{a}")
        event = JobCreated(job_id=job_id, at_ms=1_000 + n, body="{}", fingerprint=str(n), scheduling=scheduling)
        view = apply(None, event)
        assert view is not None
        await store.create(event, view)
    grants = await AdmissionStore(redis, Pacing(pinned=5), cost=(CostSettings(), 60_000)).admit(2_000, 5)
    assert grants.jobs == jobs  # the key's order, its jobs after the first taken from the parked jobs
    return grants


SINGLE_SLOT: list[tuple[str, Operation]] = [
    ("append_events (create)", _create),
    ("bounded create: the other partitions read, then append_events checks its own (SPEC S4.4)", _create_bounded),
    ("append_events (append with board and due)", _append),
    ("acquire_lease", _lease),
    ("renew_lease", _renew),
    ("release_lease", _release_lease),
    ("promote_due", _promote),
    ("admission_admit", _admit),
    ("admission_admit + admission_claim + admission_grant", _admit_with_a_waiting_job),
    ("admission_accepted", _accepted),
    ("admission_refused", _refused),
    ("admission_release", _release),
    ("admission_requeue", _requeue),
    ("admission_accepted/refused/release/requeue on an upstream past the first (SPEC S10)", _second_upstream),
    ("upstream_heard + upstream_probe + orphans (an upstream's health, SPEC S10)", _health),
    ("fair_turn + append_events (create with a fairness key)", _create_keyed),
    ("admission_enter", _enter),
    ("quota_wake + admission_enter in its woken mode (a held job back in the line, SPEC S4.4)", _return_woken),
    ("admission_fair_clear", _fair_clear),
    ("admission_fair_clear with the parked jobs (a cost-aware pass)", _fair_clear_parked),
    ("admission_ties (a pass that reaches jobs of one start tag)", _admit_with_ties),
    ("append_events (a stop leaves the line and the key's count)", _stop_waiting),
    ("replace_view (and the rebuild's MULTI read)", _replace_view),
    ("remove_deltas", _remove_deltas),
    ("line_figures (and the keys' counts looked up: HMGET)", _line_state),
    ("fair_top_repair", _fair_top_repair),
    ("board_ack", _board_ack),
    ("board_promote", _board_promote),
    ("board outbox ack+delete (MULTI)", _board_outbox_done),
    ("board outbox handover (MULTI)", _board_handover),
    ("release_lock", _release_lock),
    ("append_events (owing a callback) + callback_claim + callback_result (SPEC S5.8)", _callbacks),
    ("reindex_job", _reindex),
    ("listing read of one status", _list_one_status),
    ("listing read over two statuses", _list_statuses),
    ("session_turn + session_history + session_release (a session's turns, SPEC S4.3)", _session_turns),
    ("append_events with usage facts + usage_record (each hour's usage, SPEC S4.5)", _usage),
    ("usage_replace (the rebuild of an hour's usage)", _usage_replace),
    ("quota_take + quota_wake + quota_forget + quota_return, releases, renewals, budgets, figures (S4.4)", _quotas),
    (
        "fair_turn_cost + fair_next + fair_promote + line_heads + fair_settle + fair_fresh (what a turn costs, S4.2)",
        _cost_turns,
    ),
    (
        "fair_turn_cost + append_events (a create parked or a front) + a stop (fair_next left, fair_promote)",
        _cost_create_and_stop,
    ),
    ("line_heads + admission_claim (line or parked) + fair_next + fair_promote (a cost-aware pass)", _cost_pass),
]

#: The scripts each operation above runs (every script of the store must be covered).
COVERED = {
    "append_events", "acquire_lease", "renew_lease", "release_lease", "promote_due", "admission_admit",
    "admission_claim", "admission_grant", "admission_accepted", "admission_refused", "admission_release",
    "admission_requeue", "admission_enter", "admission_fair_clear", "admission_ties", "fair_turn",
    "replace_view", "remove_deltas", "board_ack", "board_promote", "release_lock",
    "reindex_job", "upstream_heard", "upstream_probe", "line_figures", "fair_top_repair", "session_turn",
    "session_release", "session_history", "callback_claim", "callback_result", "usage_record", "usage_replace",
    "quota_take", "quota_wake", "quota_forget", "quota_return", "fair_turn_cost", "fair_next", "fair_promote",
    "fair_settle", "fair_fresh", "line_heads", "fair_unpark",
}  # fmt: skip


@pytest.mark.parametrize(("name", "operation"), SINGLE_SLOT, ids=[name for name, _ in SINGLE_SLOT])
async def test_the_write_touches_one_slot(node: Redis, name: str, operation: Operation) -> None:
    await operation(node)  # raises CROSSSLOT otherwise


def test_every_script_of_the_store_is_exercised_here() -> None:
    assert set(NAMES) == COVERED
    assert {path.stem for path in (Path(scripts.__file__).parent / "scripts").glob("*.lua")} == COVERED


def test_every_script_header_names_its_keys_and_their_slot() -> None:
    for name in NAMES:
        header = source(name).split("\n\n")[0]
        assert "-- KEYS[1]" in header, name
        assert "one slot" in header or "one key" in header, name


@pytest.mark.parametrize("job_id", [JOB, "job_" + "0" * 32, "job_" + "f" * 32, "job_a"])
def test_every_key_of_a_job_write_maps_to_one_slot(job_id: str) -> None:
    partition = keys.partition_of(job_id)
    job_write = [
        keys.events(job_id),
        keys.view(job_id),
        keys.lease(job_id),
        keys.board(job_id),
        keys.due(partition),
        keys.line(partition),
        keys.board_outbox(partition),
        keys.board_due(partition),
        keys.board_index(partition),
        keys.deltas(partition),
        keys.scratch(partition),
        keys.fair(partition),
        keys.fair_top(partition),
        keys.compact(job_id),
        keys.arrivals(partition),
        keys.runs(partition),
        keys.callback(job_id),
        keys.callbacks_due(partition),
        keys.usage_pending(partition),
    ]
    assert len({key_slot(key.encode()) for key in job_write}) == 1
    admission = [keys.ADMISSION_STATE, keys.ADMISSION_LIVE, keys.ADMISSION_SLOTS, keys.ADMISSION_RESERVED]
    assert len({key_slot(key.encode()) for key in admission}) == 1


@pytest.mark.parametrize("name", ["hermes-2:8642", "10.0.0.7:8642/agent", "h:1/a}b", "h:1/{x}"])
def test_each_upstreams_admission_keys_map_to_one_slot_of_their_own(name: str) -> None:
    own = keys.admission(name, first=False)
    slots = {key_slot(key.encode()) for key in own.reserving}
    assert len(slots) == 1
    assert keys.admission(name, first=True) == keys.FIRST_ADMISSION
    assert own.state != keys.ADMISSION_STATE


@pytest.mark.parametrize("hour", [0, 3600, 1_796_000_400])
def test_an_hours_usage_keys_map_to_one_slot(hour: int) -> None:
    assert len({key_slot(key.encode()) for key in keys.usage(hour).all}) == 1


@given(st.text(max_size=64))
def test_a_keys_quota_keys_map_to_the_one_quota_slot(fairness_key: str) -> None:
    names = [keys.quota_live(fairness_key), keys.quota_held(fairness_key), keys.quota_woken(fairness_key)]
    slots = {key_slot(name.encode()) for name in [*names, keys.quota_tokens(fairness_key)]}
    assert slots == {key_slot(keys.QUOTA_HELD_KEYS.encode())} == {key_slot(keys.QUOTA_HOLDS.encode())}


@given(st.text(max_size=64), st.sampled_from(fair.PRIORITIES))
def test_a_keys_cost_keys_map_to_the_slot_of_its_turns(fairness_key: str, priority: int) -> None:
    own = keys.cost_keys(fairness_key, priority)
    assert {key_slot(name.encode()) for name in own.all} == {key_slot(own.turns.encode())}
    assert own.turns == keys.turns(keys.fairness_partition(fairness_key), priority)
    assert len(set(own.all)) == len(own.all)


@pytest.mark.parametrize("job_id", [JOB, "job_" + "0" * 32, "job_a"])
def test_the_parked_jobs_and_fronts_share_their_lines_slot(job_id: str) -> None:
    partition = keys.partition_of(job_id)
    names = [keys.line(partition), keys.parked(partition), keys.fronts(partition), keys.view(job_id)]
    assert len({key_slot(name.encode()) for name in names}) == 1


def test_the_partitions_spread_over_many_slots() -> None:
    slots = {key_slot(keys.due(partition).encode()) for partition in keys.partitions()}
    assert len(slots) == keys.PARTITIONS
    thirds = {slot * 3 // 16384 for slot in slots}  # `redis-cli --cluster create` with three masters
    assert thirds == {0, 1, 2}


async def test_a_cross_slot_script_is_refused(node: Redis, cluster_node: RedisServer) -> None:
    # The check itself can fail: a script over keys of two slots is refused, by the node and by the client.
    plain = Redis(port=cluster_node.port)
    with pytest.raises(ClusterCrossSlotError):
        await plain.eval("return redis.call('SET', KEYS[1], '1')", 2, "{a}x", "{b}y")
    await plain.aclose()
    with pytest.raises(ClusterCrossSlotError):
        await node.eval("return redis.call('SET', KEYS[1], '1')", 2, "{a}x", "{b}y")
