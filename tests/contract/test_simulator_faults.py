"""Simulator-only behaviour the contract suite cannot provoke on a real Hermes on demand: faults and upstream main."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from broker.hermes import (
    Accepted,
    AiohttpHermesClient,
    Busy,
    Comment,
    Draining,
    HermesEvent,
    NotFound,
    Rejected,
    StreamEnded,
    Unavailable,
)
from broker.simulator import Settings, Simulator, create_app, simulator_key
from tests.contract.helpers import body, collect, create, events, settled, wait_for

KEY = "sim-key-0123456789abcdef"
ServerFactory = Callable[[web.Application], Awaitable[TestServer]]


@pytest.fixture
async def sim_app() -> web.Application:
    return create_app(Settings(api_key=KEY, keepalive_s=0.05, approval_timeout_s=0.5, events_wait_s=0.1))


@pytest.fixture
async def sim(sim_app: web.Application) -> Simulator:
    return sim_app[simulator_key]


@pytest.fixture
async def client(sim_app: web.Application, aiohttp_server: ServerFactory) -> AsyncIterator[AiohttpHermesClient]:
    server = await aiohttp_server(sim_app)
    client = AiohttpHermesClient(str(server.make_url("")), KEY, 1_000)
    yield client
    await client.aclose()


async def test_a_stream_with_only_keepalives_ends_after_the_idle_timeout(client: AiohttpHermesClient) -> None:
    run_id = await create(client, "slow sleep:5")
    items = await collect(client, run_id, idle_timeout_s=0.3)
    assert Comment("keepalive") in items
    assert items[-1] == StreamEnded(clean=False)
    assert not events(items)


async def test_busy_and_draining(client: AiohttpHermesClient, sim: Simulator) -> None:
    sim.settings.busy = True
    assert await client.create(body("x")) == Busy(1.0)
    sim.settings.draining = True  # draining is checked first, as in Hermes
    assert await client.create(body("x")) == Draining(1.0)


async def test_refused_and_slow_hermes_is_unavailable(client: AiohttpHermesClient, sim: Simulator) -> None:
    sim.refuse_until = float("inf")
    assert isinstance(await client.create(body("x")), Unavailable)
    assert isinstance(await client.get("run_x"), Unavailable)
    assert [type(item) for item in await collect(client, "run_x")] == [Unavailable]
    sim.refuse_until = 0
    sim.settings.delay_s = 1.5
    slow = await client.get("run_x")
    assert isinstance(slow, Unavailable) and slow.reason.startswith("Hermes did not answer within ")
    assert [entry["status"] for entry in sim.requests][:3] == [None, None, None]


async def test_an_interrupted_stream_ends_uncleanly_and_cannot_be_reopened(
    client: AiohttpHermesClient, sim: Simulator
) -> None:
    run_id = await create(client, "slow sleep:2")
    async with aclosing(client.events(run_id, idle_timeout_s=5)) as stream:
        async for item in stream:
            if isinstance(item, Comment):
                sim.runs[run_id].stream.drop_subscribers()  # type: ignore[union-attr]
            last = item
    assert last == StreamEnded(clean=False)
    assert await collect(client, run_id) == [NotFound(run_id)]
    assert (await wait_for(client, run_id, settled)).status == "completed"


async def test_an_unanswered_approval_counts_as_deny(client: AiohttpHermesClient) -> None:
    run_id = await create(client, "approval")
    names = [event.name for event in events(await collect(client, run_id))]
    assert names[:3] == ["tool.started", "approval.request", "tool.completed"]
    assert names[-1] == "run.completed"


async def test_stop_while_waiting_for_approval_cancels(client: AiohttpHermesClient) -> None:
    run_id = await create(client, "approval")
    await wait_for(client, run_id, lambda run: run.status == "waiting_for_approval")
    await client.stop(run_id)
    received = events(await collect(client, run_id))
    assert [event.name for event in received] == ["tool.started", "approval.request", "tool.completed", "run.cancelled"]
    assert received[2].payload["error"] is True


async def test_a_killed_hermes_breaks_streams_and_forgets_runs(client: AiohttpHermesClient, sim: Simulator) -> None:
    run_id = await create(client, "slow sleep:2")
    async with aclosing(client.events(run_id, idle_timeout_s=5)) as stream:
        async for item in stream:
            if isinstance(item, Comment):
                await sim.restart(cancel=False, down_s=0)
            last = item
    assert last == StreamEnded(clean=False)
    assert await client.get(run_id) == NotFound(run_id)


async def test_a_body_that_is_not_an_object_is_a_400(client: AiohttpHermesClient) -> None:
    # Deliberate difference: Hermes 0.19.0 answers a plain-text 500 here.
    assert await client.create(b"[1, 2]") == Rejected(400, "Request body must be a JSON object", None)


async def test_upstream_main_replays_keyed_creates_and_reports_interrupted(
    client: AiohttpHermesClient, sim: Simulator
) -> None:
    sim.settings.upstream_main = True
    first = await client.create(body("slow sleep:5"), idempotency_key="job_1")
    assert isinstance(first, Accepted) and not first.replayed
    assert await client.create(body("slow sleep:5"), idempotency_key="job_1") == Accepted(first.run_id, replayed=True)
    conflict = await client.create(body("something else"), idempotency_key="job_1")
    assert isinstance(conflict, Rejected) and (conflict.status, conflict.code) == (409, "idempotency_key_conflict")
    unkeyed = await create(client, "slow sleep:5")
    await sim.restart(cancel=False, down_s=0)
    run = await client.get(first.run_id)
    assert not isinstance(run, NotFound | Unavailable)
    assert (run.status, run.last_event, run.error) == (  # type: ignore[union-attr]
        "interrupted",
        "run.interrupted",
        "The gateway restarted before this run settled.",
    )
    assert await client.get(unkeyed) == NotFound(unkeyed)
    assert await client.create(body("slow sleep:5"), idempotency_key="job_1") == Accepted(first.run_id, replayed=True)
    keys = [entry["idempotency_key"] for entry in sim.requests if entry["path"] == "/v1/runs"]
    assert keys == ["job_1", "job_1", "job_1", None, "job_1"]


async def test_event_payloads_pass_through_unchanged(client: AiohttpHermesClient) -> None:
    run_id = await create(client, "hello")
    received = [item for item in await collect(client, run_id) if isinstance(item, HermesEvent)]
    assert all(event.payload["run_id"] == run_id for event in received)


async def test_a_deltas_marker_streams_that_many_deltas_then_completes(client: AiohttpHermesClient) -> None:
    run_id = await create(client, "bench deltas:150")
    received = events(await collect(client, run_id))
    assert [event.name for event in received] == ["message.delta"] * 150 + ["reasoning.available", "run.completed"]
    # reasoning.available repeats the reply's text, as Hermes does at most 500 characters of it
    reply = "".join(str(event.payload["delta"]) for event in received[:150])
    assert len(reply) > 500 and received[150].payload["text"] == reply[:500]


async def test_stats_count_creates_by_answer_and_live_runs(
    sim_app: web.Application, aiohttp_server: ServerFactory
) -> None:
    server = await aiohttp_server(sim_app)
    sim = sim_app[simulator_key]
    client = AiohttpHermesClient(str(server.make_url("")), KEY, 1_000)
    async with aiohttp.ClientSession(str(server.make_url(""))) as control:
        sim.settings.max_concurrent = 2
        first, _ = await create(client, "slow sleep:5"), await create(client, "slow sleep:5")
        assert await client.create(body("x")) == Busy(1.0)
        stats = await (await control.get("/_sim/stats")).json()
        assert (stats["live"], stats["peak_live"], stats["settled"]) == (2, 2, 0)
        assert stats["creates"] == {"202": 2, "429": 1}
        assert (await control.post("/_sim/settings", json={"max_concurrent": 3})).status == 200
        await wait_for(client, await create(client, "hello"), lambda run: run.status == "completed")
        await client.stop(first)
        stats = await (await control.get("/_sim/stats")).json()
        assert (stats["peak_live"], stats["settled"], stats["creates"]) == (3, 1, {"202": 3, "429": 1})
        reset = await (await control.delete("/_sim/stats")).json()
        assert reset["creates"] == {} and reset["peak_live"] == reset["live"] <= 2
    await client.aclose()


async def test_a_proxy_that_takes_less_answers_its_own_html_413(client: AiohttpHermesClient, sim: Simulator) -> None:
    # Given a proxy in front of Hermes that takes at most 1 MiB (nginx's default client_max_body_size)
    sim.settings.proxy_max_body = 1_048_576
    # When a create is larger, then the answer is the proxy's page, whose text the outcome carries
    outcome = await client.create(body("x" * 1_048_576))
    assert outcome == Rejected(
        413, "Hermes answered HTTP 413: 413 Request Entity Too Large 413 Request Entity Too Large nginx", None
    )
    # And a create within it reaches Hermes
    assert isinstance(await client.create(body("hello")), Accepted)
