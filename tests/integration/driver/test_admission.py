"""Admission (SPEC S4.1, S3.2 `hold`): one line in arrival order, a limit on live runs, one probe while Hermes
refuses. Real Redis, real HTTP, the simulator in-process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.driver import supervisor
from broker.simulator.state import Simulator
from broker.store import keys
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled

pytestmark = BOTH_BACKENDS

Client = TestClient[Any, Any]


def create_keys(sim: Simulator, status: int | None = None) -> list[str]:
    """Idempotency-Keys of the creates Hermes answered (with `status`, if given), in arrival order at Hermes."""
    return [
        r["idempotency_key"]
        for r in sim.requests
        if r["method"] == "POST" and r["path"] == "/v1/runs" and (status is None or r["status"] == status)
    ]


def displacement(order: list[str], arrival: list[str]) -> int:
    """The largest distance between a job's place in `order` and its place in `arrival`."""
    place = {job_id: index for index, job_id in enumerate(arrival)}
    return max(abs(index - place[job_id]) for index, job_id in enumerate(order))


@contextlib.asynccontextmanager
async def peak_of_live_runs(sim: Simulator) -> AsyncIterator[list[int]]:
    """Samples how many runs Hermes holds while the block runs; yields a one-element list with the peak."""
    peak = [0]

    async def sample() -> None:
        while True:
            peak[0] = max(peak[0], sim.active_count())
            await asyncio.sleep(0.005)

    task = asyncio.create_task(sample())
    try:
        yield peak
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def refused(sim: Simulator, count: int) -> Callable[[], Awaitable[bool]]:
    async def probe() -> bool:
        return len(create_keys(sim, 429)) >= count

    return probe


async def readiness(replica: Client) -> dict[str, Any]:
    answer: dict[str, Any] = await (await replica.get("/readyz")).json()
    return answer


async def test_jobs_get_hermes_runs_in_arrival_order_across_two_replicas(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given Hermes with room for 3 runs and two replicas that learn that limit
    sim.settings.max_concurrent = 3
    a, b = await make_replica(), await make_replica()
    # When 18 jobs arrive, alternately through both replicas
    arrival = [(await create(a if i % 2 else b, {"input": f"job {i} sleep:0.15"}))["run_id"] for i in range(18)]
    async with peak_of_live_runs(sim) as peak:
        done = [await settled(a, job_id, timeout=30) for job_id in arrival]
    # Then all complete, Hermes created their runs in arrival order (but for creates in flight together),
    # never held more than its cap, and refused only the few creates that taught the limit
    assert all(d["status"] == "completed" and d["attempts"] == 1 for d in done)
    assert sorted(create_keys(sim, 202)) == sorted(arrival)
    assert displacement(create_keys(sim, 202), arrival) <= 2
    assert peak[0] <= 3
    assert len(create_keys(sim, 429)) <= 3
    admission = (await readiness(a))["admission"]
    assert admission["limit"] == 3 and admission["learnt"] is True and admission["line"] == 0


async def test_a_new_job_moves_the_line_of_every_replica_without_waiting_for_a_tick(
    make_replica: ClientFactory, sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given two replicas whose admission passes never run by the clock
    monkeypatch.setattr(supervisor, "ADMIT_TICK_S", 3_600.0)
    a, b = await make_replica(), await make_replica()
    # When jobs arrive through either (each create rings the line)
    created = [(await create(a if i % 2 else b, {"input": f"job {i}"}))["run_id"] for i in range(4)]
    # Then each gets its Hermes run
    done = [await settled(a, job_id, timeout=15) for job_id in created]
    assert [d["status"] for d in done] == ["completed"] * 4
    assert sorted(create_keys(sim, 202)) == sorted(created)


async def test_a_replica_that_starts_listening_looks_at_the_line_at_once(
    make_client: ClientFactory, make_replica: ClientFactory, sim: Simulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a job that joined the line while no replica was listening, and passes that never run by the clock
    monkeypatch.setattr(supervisor, "ADMIT_TICK_S", 3_600.0)
    created = (await create(await make_client(), {"input": "early"}))["run_id"]
    # When a driving replica starts, Then it gets the job its Hermes run
    replica = await make_replica()
    assert (await settled(replica, created, timeout=15))["status"] == "completed"
    assert create_keys(sim, 202) == [created]


async def test_a_pinned_limit_is_never_exceeded_and_never_learnt(make_replica: ClientFactory, sim: Simulator) -> None:
    # Given HERMES_MAX_CONCURRENT=2 in front of a Hermes with room for 10
    replica = await make_replica(hermes_max_concurrent=2)
    # When 8 jobs arrive at once
    arrival = [(await create(replica, {"input": f"job {i} sleep:0.15"}))["run_id"] for i in range(8)]
    async with peak_of_live_runs(sim) as peak:
        done = [await settled(replica, job_id, timeout=30) for job_id in arrival]
    # Then at most 2 of them ran at a time, in order (but for the two in flight together), and Hermes refused nothing
    assert all(d["status"] == "completed" for d in done)
    assert peak[0] == 2
    assert sorted(create_keys(sim)) == sorted(arrival) and displacement(create_keys(sim), arrival) <= 1
    admission = (await readiness(replica))["admission"]
    assert admission["limit"] == 2 and admission["learnt"] is False


async def test_a_busy_spell_sends_one_paced_probe_and_the_line_keeps_its_order(
    make_replica: ClientFactory, sim: Simulator, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a Hermes that refuses every create, and 200 jobs waiting for it
    sim.settings.busy = True
    replica = await make_replica(runs_backoff_ms=100, runs_backoff_max_ms=400)
    arrival = [(await create(replica, {"input": f"job {i}"}))["run_id"] for i in range(200)]

    await eventually(refused(sim, 2))
    # Then while it refuses, every waiting job shows the line's hold with Hermes's words and its own since
    for job_id in (arrival[0], arrival[100], arrival[-1]):
        held = await job(replica, job_id)
        assert held["status"] == "queued" and held["attempts"] == 0
        assert held["hold"]["reason"] == "busy"
        assert held["hold"]["detail"].startswith("Too many concurrent runs")
        assert held["hold"]["since"] >= held["created_at"] - 0.001
    listed = await (await replica.get("/v1/runs?status=queued&limit=200")).json()
    assert len(listed["data"]) == 200 and all(item["hold"]["reason"] == "busy" for item in listed["data"])
    spell_s = 1.5
    await asyncio.sleep(spell_s)  # the spell itself: what is measured is how little the broker does during it
    probes = len(create_keys(sim))
    assert probes <= spell_s / 0.05 + 4  # one at a time, paced by the (jittered, doubling) backoff
    assert probes < 40  # not one per waiting job
    admission = (await readiness(replica))["admission"]
    assert admission["refusing"] is True and admission["reason"] == "busy" and admission["line"] >= 199
    refusing = [r for r in caplog.records if r.message.startswith("Hermes is refusing creates")]
    assert len(refusing) == 1 and refusing[0].levelname == "WARNING"  # one warn line per refusal streak
    # When the spell ends, every job runs, in arrival order, none lost and none twice
    sim.settings.busy = False
    done = [await settled(replica, job_id, timeout=60) for job_id in arrival]
    assert all(d["status"] == "completed" and d["attempts"] == 1 for d in done)
    accepted = create_keys(sim, 202)
    assert sorted(accepted) == sorted(arrival)
    assert displacement(accepted, arrival) <= 2 * sim.settings.max_concurrent


async def test_a_stop_in_the_line_cancels_at_once_and_hermes_never_sees_it(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given jobs waiting while Hermes refuses (the first two were sent before the first refusal: slow start)
    sim.settings.busy = True
    replica = await make_replica()
    jobs = [(await create(replica, {"input": f"job {i}"}))["run_id"] for i in range(5)]
    await eventually(refused(sim, 2))
    # When one further down the line is stopped
    answer = await replica.post(f"/v1/runs/{jobs[3]}/stop")
    # Then it is cancelled at once, leaves the line, and Hermes is never asked to create it
    assert (await answer.json()) == {"run_id": jobs[3], "status": "cancelled"}
    stopped = await job(replica, jobs[3])
    assert stopped["status"] == "cancelled" and stopped["error"]["code"] == "stopped" and stopped["hold"] is None
    assert await redis.zscore(keys.line(keys.partition_of(jobs[3])), jobs[3]) is None
    sim.settings.busy = False
    for other in jobs[:3] + jobs[4:]:
        assert (await settled(replica, other))["status"] == "completed"
    assert jobs[3] not in create_keys(sim)


async def test_a_hold_expires_while_in_the_line(make_replica: ClientFactory, sim: Simulator, redis: Redis) -> None:
    # Given a Hermes that refuses, and RUNS_HOLD of 600 ms
    sim.settings.busy = True
    replica = await make_replica(runs_hold_ms=600)
    jobs = [(await create(replica, {"input": f"job {i}"}))["run_id"] for i in range(5)]
    # Then every job fails hold_expired, none was ever run, and the line is empty
    for job_id in jobs:
        expired = await settled(replica, job_id, timeout=10)
        assert expired["status"] == "failed" and expired["error"]["code"] == "hold_expired"
        assert expired["attempts"] == 0
    assert sum([await redis.zcard(keys.line(p)) for p in keys.partitions()]) == 0
    assert create_keys(sim, 202) == []


async def hold_of(replica: Client, job_id: str) -> dict[str, Any]:
    async def held() -> dict[str, Any] | None:
        current = await job(replica, job_id)
        return current["hold"] if current["hold"] else None

    hold: dict[str, Any] = await eventually(held)
    return hold


async def test_hold_detail_is_hermes_own_words_for_a_403(make_replica: ClientFactory, sim: Simulator) -> None:
    # Given a Hermes without an API key, which refuses session keys with a 403
    replica = await make_replica()
    # When a job with X-Hermes-Session-Key is created
    created = await create(replica, {"input": "hello"}, **{"X-Hermes-Session-Key": "user-1"})
    # Then it holds as unavailable, and says why in Hermes's words
    hold = await hold_of(replica, created["run_id"])
    assert hold["reason"] == "unavailable"
    assert hold["detail"].startswith("X-Hermes-Session-Key requires API key authentication")
    stream = await replica.get(f"/v1/runs/{created['run_id']}/events")
    first_held = ""
    while not first_held:
        line = (await stream.content.readline()).decode()
        first_held = line if '"job.held"' in line else ""
    assert "X-Hermes-Session-Key requires API key authentication" in first_held  # the stream keeps it too
    stream.close()


async def test_hold_detail_for_a_refused_connection(make_client: ClientFactory) -> None:
    # Given a Hermes URL where nothing listens
    replica = await make_client(drive=True, hermes_url="http://127.0.0.1:9", runs_backoff_ms=50)
    created = await create(replica, {"input": "hello"})
    # Then the job holds as unavailable (at first, when the health probe found it down before the job's create went:
    # with when Hermes stopped answering), then with the broker's own sentence for its create

    async def refused() -> dict[str, Any] | None:
        hold = await hold_of(replica, created["run_id"])
        assert hold["reason"] == "unavailable" and hold["detail"], hold
        return hold if hold["detail"] == "Hermes refused the connection." else None

    await eventually(refused)


async def test_a_fresh_replicas_first_creates_take_their_places_in_the_order_they_arrived(
    make_client: ClientFactory, redis: Redis, redis_target: tuple[str, bool]
) -> None:
    if redis_target[1]:
        pytest.skip("on a cluster a create takes its turn in a call of its own: concurrent creates have no order")
    for _ in range(3):  # each a replica that has read nothing yet (a first create used to wait for a read, and lose)
        # Given a replica that just started, and a burst of concurrent creates as its first requests
        replica = await make_client(admission_fairness_cost="runs")  # every job in the line (not parked)
        answers = await asyncio.gather(*(create(replica, {"input": f"burst {n}"}) for n in range(60)))
        ids = [answer["run_id"] for answer in answers]
        # Then the line holds them in the order of their created_at (one key: plain arrival order)
        created = {job_id: (await job(replica, job_id))["created_at"] for job_id in ids}
        places = {job_id: await redis.zscore(keys.line(keys.partition_of(job_id)), job_id) for job_id in ids}
        by_place = sorted(ids, key=lambda job_id: places[job_id])
        assert [created[job_id] for job_id in by_place] == sorted(created.values())
