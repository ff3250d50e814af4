"""Several Hermes deployments (SPEC S10) as the driver sees them, on a single Redis and on a cluster: spread and
caps, the attempt's upstream (job.accepted, stop, approval, resubmits), session affinity, a lost upstream."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from broker.events import JobHeld, JobRerouted, RunAccepted, RunInterrupted
from broker.http.appkeys import store_key
from broker.simulator.app import create_app as create_simulator
from broker.simulator.control import simulator_key
from broker.simulator.state import Settings, Simulator
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled

pytestmark = BOTH_BACKENDS  # a single Redis and a local cluster: each upstream its own slot


async def test_an_accepted_run_records_its_upstream_and_the_job_shows_it(
    make_replica: ClientFactory, make_client: ClientFactory, hermes_server: TestServer, sim: Simulator
) -> None:
    # Given a replica whose first upstream is the simulator (a second one is listed, nobody listens there)
    simulator = str(hermes_server.make_url("")).rstrip("/")
    name = simulator.removeprefix("http://")
    replica = await make_replica(hermes_url=f"{simulator},http://127.0.0.1:9/agent")
    # and a job created while no replica drives (it waits: upstream null)
    waiting = await make_client()
    created = await create(waiting, {"input": "hello"})
    assert created["upstream"] is None and (await job(waiting, created["run_id"]))["upstream"] is None
    # When it runs to the end
    done = await settled(replica, created["run_id"])
    # Then it shows the upstream that ran it, and its job.accepted event names it
    assert done["status"] == "completed" and done["upstream"] == name
    events = await replica.app[store_key].read(created["run_id"])  # type: ignore[index]
    accepted = [event for _, event in events if isinstance(event, RunAccepted)]
    assert [event.upstream for event in accepted] == [name]
    listed: Any = await (await replica.get("/v1/runs")).json()
    assert listed["data"][0]["upstream"] == name


@pytest.fixture
async def second_hermes(aiohttp_server: Any) -> TestServer:
    """Another Hermes deployment (SPEC S10): a second simulator process-alike on its own port."""
    server: TestServer = await aiohttp_server(create_simulator(Settings(step_s=0.01, events_wait_s=0.2)))
    return server


def url_of(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


def name_of(server: TestServer) -> str:
    """The upstream name of a simulator (its URL without the scheme, SPEC S10)."""
    return url_of(server).removeprefix("http://")


def both(first: TestServer, second: TestServer) -> str:
    """HERMES_URL listing two simulators, in that order."""
    return f"{url_of(first)},{url_of(second)}"


def sim_of(server: TestServer) -> Simulator:
    return server.app[simulator_key]  # type: ignore[index]


def creates(sim: Simulator) -> list[str]:
    return [r["idempotency_key"] for r in sim.requests if r["method"] == "POST" and r["path"] == "/v1/runs"]


async def test_jobs_spread_over_two_upstreams_each_within_its_own_limit(
    make_replica: ClientFactory, hermes_server: TestServer, second_hermes: TestServer, sim: Simulator
) -> None:
    # Given two upstreams with room for 2 and 4 runs, pinned at their capacity, and two replicas
    other = sim_of(second_hermes)
    sim.settings.max_concurrent, other.settings.max_concurrent = 2, 4
    settings = {"hermes_url": both(hermes_server, second_hermes), "hermes_max_concurrent": (2, 4)}
    a, b = await make_replica(**settings), await make_replica(**settings)
    # When 18 jobs arrive through both
    arrival = [(await create(a if i % 2 else b, {"input": f"job {i} sleep:0.2"}))["run_id"] for i in range(18)]
    done = [await settled(a, job_id, timeout=30) for job_id in arrival]
    # Then every job completed once, each on the upstream its object names, and neither Hermes saw more than its
    # cap live or refused a create: the line filled both
    assert all(d["status"] == "completed" for d in done)
    first, second = name_of(hermes_server), name_of(second_hermes)
    on_first = {d["run_id"] for d in done if d["upstream"] == first}
    on_second = {d["run_id"] for d in done if d["upstream"] == second}
    assert on_first | on_second == set(arrival)
    assert sorted(creates(sim)) == sorted(on_first) and sorted(creates(other)) == sorted(on_second)
    assert sim.stats()["peak_live"] <= 2 and other.stats()["peak_live"] <= 4
    assert other.stats()["peak_live"] >= 3  # the larger one was filled past the smaller one's capacity
    assert len(on_second) > len(on_first)
    refused = [r for s in (sim, other) for r in s.requests if r["path"] == "/v1/runs" and r["status"] == 429]
    assert refused == []

    async def slots_back() -> list[tuple[str, int, int]] | None:  # a run's slot goes back just after its last write
        admission = (await (await a.get("/readyz")).json())["admission"]["upstreams"]
        found = [(u["name"], u["live"], u["limit"]) for u in admission]
        return found if found == [(first, 0, 2), (second, 0, 4)] else None

    await eventually(slots_back)


async def test_each_upstream_learns_its_own_limit(
    make_replica: ClientFactory, hermes_server: TestServer, second_hermes: TestServer, sim: Simulator
) -> None:
    # Given two upstreams of capacity 2 and 5 and limits to learn (HERMES_MAX_CONCURRENT=0, SPEC S4.1 per upstream)
    other = sim_of(second_hermes)
    sim.settings.max_concurrent, other.settings.max_concurrent = 2, 5
    replica = await make_replica(hermes_url=both(hermes_server, second_hermes), hermes_max_concurrent=0)
    # When a backlog of 30 jobs runs through
    arrival = [(await create(replica, {"input": f"job {i} sleep:0.3"}))["run_id"] for i in range(30)]
    done = [await settled(replica, job_id, timeout=60) for job_id in arrival]
    # Then every job completed, each Hermes filled to its own capacity (the small one's 429s never held the large
    # one back), and each learnt limit settled at its own upstream's capacity (a 429 sets L to the live runs)
    assert all(d["status"] == "completed" for d in done)
    assert sim.stats()["peak_live"] == 2 and other.stats()["peak_live"] == 5
    admission = (await (await replica.get("/readyz")).json())["admission"]["upstreams"]
    limits = {u["name"]: (u["learnt"], u["limit"]) for u in admission}
    first, second = name_of(hermes_server), name_of(second_hermes)
    assert limits[first][0] and limits[second][0]
    assert 2 <= limits[first][1] <= 3, limits  # at its capacity, or one past it after a quiet while (S4.1)
    assert 5 <= limits[second][1] <= 6, limits
    refused = [[r for r in s.requests if r["path"] == "/v1/runs" and r["status"] == 429] for s in (sim, other)]
    assert len(refused[0]) + len(refused[1]) <= 8  # slow start finds each capacity with a few refusals, not a flood


async def test_stop_and_approval_reach_the_upstream_of_the_run(
    make_replica: ClientFactory, hermes_server: TestServer, second_hermes: TestServer, sim: Simulator
) -> None:
    # Given the first upstream full (pinned at 1, one long run), so the next jobs go to the second
    other = sim_of(second_hermes)
    replica = await make_replica(hermes_url=both(hermes_server, second_hermes), hermes_max_concurrent=(1, 4))
    blocker = await create(replica, {"input": "block sleep:5"})
    await eventually(lambda: _running(replica, blocker["run_id"]))
    asking = await create(replica, {"input": "please approval"})
    stopping = await create(replica, {"input": "long sleep:5"})
    second = name_of(second_hermes)
    waiting = await eventually(lambda: _status(replica, asking["run_id"], "waiting_for_approval"))
    assert waiting["upstream"] == second
    running = await eventually(lambda: _running(replica, stopping["run_id"]))
    assert running["upstream"] == second
    # When the approval is answered and the other job is stopped
    answer = await replica.post(f"/v1/runs/{asking['run_id']}/approval", json={"choice": "once"})
    assert answer.status == 200, await answer.text()
    assert (await replica.post(f"/v1/runs/{stopping['run_id']}/stop")).status in (200, 202)
    # Then both went to the second upstream (with its run ids), none to the first
    assert (await settled(replica, asking["run_id"]))["status"] == "completed"
    assert (await settled(replica, stopping["run_id"]))["status"] == "cancelled"
    paths = [r["path"] for r in other.requests]
    assert f"/v1/runs/{waiting['hermes_run_id']}/approval" in paths
    assert f"/v1/runs/{running['hermes_run_id']}/stop" in paths
    assert not [r for r in sim.requests if r["path"].endswith(("/approval", "/stop"))]


async def _status(client: Any, job_id: str, status: str) -> dict[str, Any] | None:
    current = await job(client, job_id)
    return current if current["status"] == status else None


async def _running(client: Any, job_id: str) -> dict[str, Any] | None:
    return await _status(client, job_id, "running")


async def _idle(client: Any) -> bool:
    """No upstream holds a live run or a create in flight (a run's slot goes back just after its last write)."""
    admission = (await (await client.get("/readyz")).json())["admission"]["upstreams"]
    return all(upstream["live"] == 0 for upstream in admission)


@pytest.mark.parametrize("second_down", [False, True], ids=["its-upstream-up", "its-upstream-down"])
async def test_an_interrupted_run_resubmits_to_its_upstream_while_up_else_elsewhere(
    make_replica: ClientFactory,
    hermes_server: TestServer,
    second_hermes: TestServer,
    sim: Simulator,
    second_down: bool,
) -> None:
    # Given a job running on the second upstream (the first is full with a short blocker)
    other = sim_of(second_hermes)
    replica = await make_replica(hermes_url=both(hermes_server, second_hermes), hermes_max_concurrent=(1, 4))
    blocker = await create(replica, {"input": "block sleep:1"})
    await eventually(lambda: _running(replica, blocker["run_id"]))
    created = await create(replica, {"input": "long sleep:2"})
    running = await eventually(lambda: _running(replica, created["run_id"]))
    second = name_of(second_hermes)
    first = name_of(hermes_server)
    assert running["upstream"] == second
    # When its run is lost there (Hermes forgot it: 404), the second upstream being up, or draining
    if second_down:
        other.settings.draining = True
    async with aiohttp.ClientSession() as session:
        url = f"{url_of(second_hermes)}/_sim/runs/{running['hermes_run_id']}/interrupt"
        async with session.post(url, json={"forget": True}) as answer:
            assert answer.status == 200
    # Then attempt 2 runs on the second while it is up, else (once it refused the create) on the first
    done = await settled(replica, created["run_id"], timeout=30)
    assert done["status"] == "completed" and done["attempts"] == 2
    assert done["upstream"] == (first if second_down else second)
    resubmit = f"{created['run_id']}#2"
    # (a draining upstream refuses each probe; the job probes it again while the first is still full)
    assert creates(sim).count(resubmit) == (1 if second_down else 0)
    refused_or_run = creates(other).count(resubmit)
    assert refused_or_run >= 1 if second_down else refused_or_run == 1


async def test_a_session_keeps_its_upstream_and_waits_for_it_while_it_is_busy(
    make_replica: ClientFactory, hermes_server: TestServer, second_hermes: TestServer, sim: Simulator
) -> None:
    # Given two upstreams of one slot each, and a session whose first job ran on the first
    other = sim_of(second_hermes)
    replica = await make_replica(hermes_url=both(hermes_server, second_hermes), hermes_max_concurrent=(1, 1))
    first, second = name_of(hermes_server), name_of(second_hermes)
    opening = await settled(replica, (await create(replica, {"input": "hi", "session_id": "s-1"}))["run_id"])
    assert opening["upstream"] == first
    await eventually(lambda: _idle(replica))  # its slot goes back just after its last write
    # When the first is busy with a long job and the session's next turn arrives, then a job of no session
    busy = await create(replica, {"input": "block sleep:1"})
    assert (await eventually(lambda: _running(replica, busy["run_id"])))["upstream"] == first
    turn = await create(replica, {"input": "turn two", "session_id": "s-1"})
    loose = await create(replica, {"input": "no session"})
    # Then the job of no session goes to the second at once, while the session's turn waits for the first
    assert (await settled(replica, loose["run_id"]))["upstream"] == second
    waiting = await job(replica, turn["run_id"])
    assert waiting["status"] == "queued"
    # and its hold says which upstream it waits for, and why (SPEC S3.2: never null while it waits for Hermes)
    assert waiting["hold"] is not None and waiting["hold"]["reason"] == "busy"
    assert waiting["hold"]["detail"] == f"Hermes {first} is at capacity (1 live run)."
    done = await settled(replica, turn["run_id"], timeout=20)
    assert done["upstream"] == first and done["status"] == "completed"
    assert turn["run_id"] not in creates(other)


async def test_a_session_moves_after_the_grace_of_its_upstream_being_down_with_a_rerouted_event(
    make_replica: ClientFactory, hermes_server: TestServer, second_hermes: TestServer, sim: Simulator
) -> None:
    # Given a session whose first job ran on the first upstream
    replica = await make_replica(hermes_url=both(hermes_server, second_hermes), hermes_affinity_grace_ms=600)
    first, second = name_of(hermes_server), name_of(second_hermes)
    opening = await settled(replica, (await create(replica, {"input": "hi", "session_id": "s-2"}))["run_id"])
    assert opening["upstream"] == first
    # When the first upstream drains (503) and the session's next turn arrives
    sim.settings.draining = True
    turn = await create(replica, {"input": "turn two", "session_id": "s-2"})
    # Then it waits for the grace, then runs on the second, and its events say it moved, from where and why
    done = await settled(replica, turn["run_id"], timeout=20)
    assert done["status"] == "completed" and done["upstream"] == second
    events = await replica.app[store_key].read(turn["run_id"])  # type: ignore[index]
    moved = [event for _, event in events if isinstance(event, JobRerouted)]
    assert [(e.from_upstream, e.to_upstream, e.reason) for e in moved] == [(first, second, "draining")]
    held = [event for _, event in events if isinstance(event, JobHeld)]
    assert held and moved[0].at_ms - held[0].at_ms >= 600 - 50  # not before the grace
    # and the session's upstream follows it: the next turn goes to the second even once the first is back
    sim.settings.draining = False
    third = await settled(replica, (await create(replica, {"input": "three", "session_id": "s-2"}))["run_id"])
    assert third["upstream"] == second


async def test_a_lost_upstreams_run_is_resubmitted_elsewhere_only_after_it_was_silent_for_the_lost_time(
    make_replica: ClientFactory, hermes_server: TestServer, second_hermes: TestServer, sim: Simulator
) -> None:
    # Given a job running on the second upstream (the first full with a short blocker), lost after 1.5 s of silence
    replica = await make_replica(
        hermes_url=both(hermes_server, second_hermes),
        hermes_max_concurrent=(1, 4),
        hermes_upstream_lost_ms=1_500,
    )
    first = name_of(hermes_server)
    blocker = await create(replica, {"input": "block sleep:2"})
    await eventually(lambda: _running(replica, blocker["run_id"]))
    created = await create(replica, {"input": "long sleep:3"})
    running = await eventually(lambda: _running(replica, created["run_id"]))
    assert running["upstream"] != first
    # When the second upstream goes silent (it drops every connection, its run's stream too, and answers nothing)
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url_of(second_hermes)}/_sim/refuse", json={"seconds": 120}) as answer:
            assert answer.status == 200
    gone_ms = int(time.time() * 1000)
    # Then the run is polled, and only once the upstream was silent for the lost time is it resubmitted (attempt 2)
    # to the first, where it completes: no second run while the first one may have been live
    done = await settled(replica, created["run_id"], timeout=60)
    assert done["status"] == "completed" and done["attempts"] == 2 and done["upstream"] == first
    events = await replica.app[store_key].read(created["run_id"])  # type: ignore[index]
    interrupted = [e for _, e in events if isinstance(e, RunInterrupted)]
    assert [e.reason for e in interrupted] == ["upstream_lost"]
    assert interrupted[0].at_ms - gone_ms >= 1_500 - 100
    assert creates(sim).count(f"{created['run_id']}#2") == 1
    admission = (await (await replica.get("/readyz")).json())["admission"]["upstreams"]
    assert [u["lost"] for u in admission] == [False, True]


async def test_a_session_mid_turn_on_a_lost_upstream_keeps_its_order_and_the_next_turn_follows_elsewhere(
    make_replica: ClientFactory, hermes_server: TestServer, second_hermes: TestServer, sim: Simulator
) -> None:
    # Given a session whose first turn runs on the second upstream (the first full with a short blocker), with its
    # next turn waiting, and the second upstream lost after 1.5 s of silence
    replica = await make_replica(
        hermes_url=both(hermes_server, second_hermes), hermes_max_concurrent=(1, 4), hermes_upstream_lost_ms=1_500
    )
    first = name_of(hermes_server)
    blocker = await create(replica, {"input": "block sleep:2"})
    await eventually(lambda: _running(replica, blocker["run_id"]))
    turn = await create(replica, {"input": "turn one sleep:3", "session_id": "s-lost-mid"})
    running = await eventually(lambda: _running(replica, turn["run_id"]))
    assert running["upstream"] != first
    following = await create(replica, {"input": "turn two sleep:0.2", "session_id": "s-lost-mid"})
    assert (await job(replica, following["run_id"]))["hold"]["reason"] == "session"
    # When the second upstream goes silent
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{url_of(second_hermes)}/_sim/refuse", json={"seconds": 120}) as answer:
            assert answer.status == 200
    # Then the first turn keeps the session through its resubmit on the first upstream, and the next turn runs only
    # after it ended, on the first upstream too
    done = await settled(replica, turn["run_id"], timeout=60)
    assert done["status"] == "completed" and done["attempts"] == 2 and done["upstream"] == first
    after = await settled(replica, following["run_id"], timeout=30)
    assert after["status"] == "completed" and after["upstream"] == first
    store = replica.app[store_key]  # type: ignore[index]
    ended_at = max(e.at_ms for _, e in await store.read(turn["run_id"]))
    accepted = [e for _, e in await store.read(following["run_id"]) if isinstance(e, RunAccepted)]
    assert accepted and accepted[0].at_ms >= ended_at
