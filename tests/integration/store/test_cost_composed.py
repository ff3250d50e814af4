"""The composed cost scripts of a single Redis (SPEC S4.2 "What a turn costs"): a create takes its key's turn inside
its job write under every waiting bound and under REDIS_WAIT_REPLICAS, a replay takes none, a retry after an older
replica's first write keeps its place; a key step that places the front it expected leaves a finished one and places
the next; replicas racing creates, stops and passes lose no job, grant none twice and leave nothing behind."""

from __future__ import annotations

import asyncio
import random

import orjson
import pytest
from redis.asyncio import Redis

from broker.admission import fair
from broker.admission.pacing import Pacing
from broker.admission.quotas import Bound
from broker.errors import NotReplicated
from broker.events import JobCreated, Scheduling
from broker.store import keys
from broker.store.admission import AdmissionStore
from broker.store.cost_entry import CostEntry
from broker.store.cost_store import CostStore, entry_of
from broker.store.durability import Durability
from broker.store.jobs import JobStore
from projections.job import apply
from tests.integration.store.test_cost_entry import TIME, P, _create, _job, _stop, _waiting, _where


@pytest.mark.parametrize("bound", [None, Bound(key=5), Bound(all=50), Bound(key=5, all=50)])
async def test_a_create_takes_its_keys_turn_in_its_write_under_any_waiting_bound(
    redis: Redis, bound: Bound | None
) -> None:
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    for n in range(3):
        await _create(store, n, "team-a", bound)
    await _create(store, 3, "team-b", bound)
    assert await _where(redis, 0) == ("line", fair.score(P, 0))
    assert await _where(redis, 3) == ("line", fair.score(P, 0))
    entry = await redis.hget(keys.fronts(keys.partition_of(_job(0))), _job(0))
    assert entry is not None and entry_of(entry).key == "team-a"
    assert [(await _where(redis, n))[0] for n in (1, 2)] == ["parked", "parked"]
    line = await CostStore(redis, TIME, 60_000).key_line("team-a", P)
    assert line.front == _job(0) and line.queue == (_job(0), _job(1), _job(2))
    assert await _waiting(redis, "team-a") == 3


async def test_a_create_waiting_for_replicas_takes_one_turn_and_its_replay_none(redis: Redis) -> None:
    store = JobStore(redis, retention_ms=60_000, cost=TIME, durability=Durability(1, 10))
    for n in range(3):
        with pytest.raises(NotReplicated):
            await _create(store, n, "team-a", Bound(key=5, all=50))
    assert await _where(redis, 0) == ("line", fair.score(P, 0))
    assert [(await _where(redis, n))[0] for n in (1, 2)] == ["parked", "parked"]
    line = await CostStore(redis, TIME, 60_000).key_line("team-a", P)
    assert line.front == _job(0) and line.queue == (_job(0), _job(1), _job(2))
    # a replay (the client's retry after the 503) takes no second turn
    with pytest.raises(NotReplicated):
        await _create(store, 0, "team-a", Bound(key=5, all=50))
    again = await CostStore(redis, TIME, 60_000).key_line("team-a", P)
    assert again.front == _job(0) and again.queue == line.queue


@pytest.mark.parametrize("seed", range(4))
async def test_three_replicas_passes_grant_every_job_once(redis: Redis, seed: int) -> None:
    rnd = random.Random(seed)
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    owner: dict[str, str] = {}
    n = 0
    for _ in range(60):
        key = rnd.choice(["a", "b", "c"])
        await _create(store, n, key)
        owner[_job(n)] = key
        n += 1
    reps = [AdmissionStore(redis, Pacing(pinned=200), cost=(TIME, 60_000)) for _ in range(3)]
    granted: list[str] = []
    at = 2_000
    for _ in range(60):
        at += 1
        outs = await asyncio.gather(*(r.admit(at, rnd.randint(1, 4)) for r in reps))
        for o in outs:
            granted += o.jobs
        if len(granted) >= n:
            break
    assert len(granted) == len(set(granted)), "granted twice"
    assert set(granted) == set(owner), n - len(granted)


@pytest.mark.parametrize("seed", range(6))
async def test_racing_creates_stops_and_passes_lose_no_job_and_leave_nothing_behind(redis: Redis, seed: int) -> None:
    rnd = random.Random(seed)
    stores = [JobStore(redis, retention_ms=60_000, cost=TIME) for _ in range(2)]
    reps = [AdmissionStore(redis, Pacing(pinned=500), cost=(TIME, 60_000)) for _ in range(3)]
    owner: dict[str, str] = {}
    stopped: set[str] = set()
    granted: list[str] = []
    n = 0
    at = 2_000

    async def creates(k: int) -> None:
        nonlocal n
        for _ in range(k):
            i = n
            n += 1
            key = rnd.choice(["a", "b", "c"])
            await _create(rnd.choice(stores), i, key)
            owner[_job(i)] = key

    async def stops() -> None:
        waiting = [j for j in owner if j not in granted and j not in stopped]
        for j in rnd.sample(waiting, min(2, len(waiting))):
            i = int(j[4:], 16)
            stopped.add(j)
            await _stop(stores[0], i)

    for _ in range(40):
        at += 1
        outs = await asyncio.gather(
            creates(rnd.randint(0, 4)), stops(), *(r.admit(at, rnd.randint(1, 3)) for r in reps)
        )
        for o in outs[2:]:
            granted += o.jobs
    for _ in range(40):
        at += 10_000
        for r in reps:
            granted += (await r.admit(at, 5)).jobs
    assert len(granted) == len(set(granted)), "granted twice"
    left = set(owner) - set(granted) - stopped
    assert not left, (left, [(j, owner[j]) for j in left])
    assert await _residue(redis) == {}


async def _residue(redis: Redis) -> dict[str, object]:
    out: dict[str, object] = {}
    for p in keys.partitions():
        for name, k in (("line", keys.line(p)), ("parked", keys.parked(p))):
            if await redis.zcard(k):
                out[f"{name}{p}"] = await redis.zrange(k, 0, -1)
        if await redis.hlen(keys.fronts(p)):
            out[f"fronts{p}"] = await redis.hgetall(keys.fronts(p))
        fair_h = {k: v for k, v in (await redis.hgetall(keys.fair(p))).items() if k.startswith(b"n:") and int(v)}
        if fair_h:
            out[f"fair{p}"] = fair_h
    for key in "abc":
        q = await CostStore(redis, TIME, 60_000).key_line(key, P)
        if q.queue or q.front:
            out[f"q{key}"] = (q.front, q.queue)
    return out


async def test_a_parked_job_an_older_replica_stopped_is_left_and_its_key_goes_on(redis: Redis) -> None:
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    for n in range(3):
        await _create(store, n, "team-a")
    adm = AdmissionStore(redis, Pacing(pinned=50), cost=(TIME, 60_000))
    # an older replica's stop left job 1 parked with a finished view
    raw = await redis.hget(keys.view(_job(1)), "state")
    state = orjson.loads(raw)
    state["status"] = "cancelled"
    await redis.hset(keys.view(_job(1)), "state", orjson.dumps(state).decode())
    got = (await adm.admit(2_000, 1)).jobs
    assert got == [_job(0)]
    assert await _where(redis, 1) == ("none", None)
    assert (await _where(redis, 2))[0] == "line"
    got = (await adm.admit(60_000, 5)).jobs
    assert got == [_job(2)]


async def test_an_expected_front_found_finished_is_left_and_the_next_placed(redis: Redis) -> None:
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    for n in range(4):
        await _create(store, n, "team-a")
    adm = AdmissionStore(redis, Pacing(pinned=50), cost=(TIME, 60_000))
    assert (await adm.admit(2_000, 1)).jobs == [_job(0)]
    entry = await redis.hget(keys.fronts(keys.partition_of(_job(1))), _job(1))
    assert entry is not None and entry_of(entry).next == (_job(2), _job(3)), entry
    raw = await redis.hget(keys.view(_job(2)), "state")
    state = orjson.loads(raw)
    state["status"] = "cancelled"
    await redis.hset(keys.view(_job(2)), "state", orjson.dumps(state).decode())
    assert (await adm.admit(200_000, 1)).jobs == [_job(1)]
    assert await _where(redis, 2) == ("none", None)
    assert (await _where(redis, 3))[0] == "line"
    assert (await adm.admit(400_000, 5)).jobs == [_job(3)]
    assert await _residue(redis) == {}


async def test_retries_after_an_older_replicas_first_writes_keep_their_places(redis: Redis) -> None:
    store = JobStore(redis, retention_ms=60_000, cost=TIME)
    for n in (0, 1):
        ev = JobCreated(
            job_id=_job(n),
            at_ms=1_000 + n,
            body="{}",
            fingerprint=str(n),
            scheduling=Scheduling(priority=P, fairness_key="team-a"),
        )
        v = apply(None, ev)
        assert v is not None
        await CostEntry(redis, TIME, 60_000).enter(_job(n), v, 0)  # an older replica's first write, then it died
    await _create(store, 1, "team-a")  # the retries, in the other order
    await _create(store, 0, "team-a")
    assert await _where(redis, 0) == ("line", fair.score(P, 0))
    assert (await _where(redis, 1))[0] == "parked"
    entry = await redis.hget(keys.fronts(keys.partition_of(_job(0))), _job(0))
    assert entry is not None and entry_of(entry).key == "team-a"
    line = await CostStore(redis, TIME, 60_000).key_line("team-a", P)
    assert line.front == _job(0) and line.queue == (_job(0), _job(1))
    assert await _waiting(redis, "team-a") == 2
