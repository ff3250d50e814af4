"""SPEC S3.7: runs created on Hermes directly, relayed through the broker when RUNS_PROXY_ENABLED."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from redis.asyncio import Redis

from broker.http.appkeys import metrics_key
from broker.simulator.app import create_app as create_simulator
from broker.simulator.state import Settings
from tests.conftest import free_port
from tests.integration.conftest import ClientFactory
from tests.integration.http.test_sse_support import Client, Comment, Frame, SseReader, create_job


@pytest.fixture
async def hermes() -> AsyncIterator[TestServer]:
    server = TestServer(create_simulator(Settings(keepalive_s=0.5)))
    await server.start_server()
    yield server
    await server.close()


@pytest.fixture
async def proxying(make_client: ClientFactory, hermes: TestServer) -> Client:
    return await make_client(runs_proxy_enabled=True, hermes_url=str(hermes.make_url("")).rstrip("/"))


async def hermes_run(hermes: TestServer, text: str = "hello") -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.post(hermes.make_url("/v1/runs"), json={"input": text}) as answer,
    ):
        assert answer.status == 202
        return str((await answer.json())["run_id"])


async def test_get_of_a_hermes_run_is_relayed_with_one_log_line(
    proxying: Client, hermes: TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="broker.http.proxy")
    run_id = await hermes_run(hermes)
    answer = await proxying.get(f"/v1/runs/{run_id}")
    assert answer.status == 200
    body = await answer.json()
    assert body["object"] == "hermes.run" and body["run_id"] == run_id
    lines = [record for record in caplog.records if record.message == "Proxied a Hermes run."]
    assert len(lines) == 1
    assert {key: lines[0].__dict__[key] for key in ("run", "path", "status")} == {
        "run": run_id,
        "path": f"/v1/runs/{run_id}",
        "status": 200,
    }


async def test_events_of_a_hermes_run_stream_through_as_they_come(proxying: Client, hermes: TestServer) -> None:
    # Given a Hermes run that takes a while
    run_id = await hermes_run(hermes, "hello sleep:2")
    # When a client follows it through the broker
    response = await proxying.get(f"/v1/runs/{run_id}/events")
    assert response.status == 200 and response.headers["Content-Type"].startswith("text/event-stream")
    reader = SseReader(response)
    # Then the first event arrives while the run still runs (streamed, not buffered) ...
    first = await _data(reader)
    assert (await (await proxying.get(f"/v1/runs/{run_id}")).json())["status"] == "running"
    # ... and the stream ends as Hermes ends it: data-only frames, one terminal event, then the comment
    items: list[Any] = [first]
    while (line := await reader.response.content.readline()) != b"":
        items.append(line)
    text = b"".join(items[1:]).decode()
    assert '"event": "run.completed"' in text and text.rstrip().endswith(": stream closed")
    assert "id:" not in text and "event:" not in text.replace('"event"', "")
    assert first["run_id"] == run_id


@pytest.mark.parametrize("run_id", ["run_unknown", "job_0123456789abcdef0123456789abcdef"])
async def test_hermes_answers_for_runs_it_does_not_know(proxying: Client, run_id: str) -> None:
    for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/events"):
        answer = await proxying.get(path)
        assert answer.status == 404
        assert (await answer.json())["error"]["code"] == "run_not_found"


async def test_broker_jobs_are_never_proxied(proxying: Client, redis: Redis) -> None:
    job = await create_job(proxying)
    answer = await proxying.get(f"/v1/runs/{job}")
    assert answer.status == 200 and (await answer.json())["status"] == "queued"
    reader = SseReader(await proxying.get(f"/v1/runs/{job}/events"))
    item = await reader.item()
    assert isinstance(item, Frame) and item.data["event"] == "job.queued"


async def test_disabled_proxy_answers_404_without_asking_hermes(
    make_client: ClientFactory, hermes: TestServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    client = await make_client(hermes_url=str(hermes.make_url("")).rstrip("/"))
    run_id = await hermes_run(hermes)
    for path in (f"/v1/runs/{run_id}", f"/v1/runs/{run_id}/events"):
        answer = await client.get(path)
        assert answer.status == 404
        assert (await answer.json())["error"]["code"] == "run_not_found"
    assert not any(record.message == "Called Hermes." for record in caplog.records)


async def test_unreachable_hermes_is_a_503_envelope(make_client: ClientFactory) -> None:
    client = await make_client(runs_proxy_enabled=True, hermes_url=f"http://127.0.0.1:{free_port()}")
    for path in ("/v1/runs/run_x", "/v1/runs/run_x/events"):
        answer = await client.get(path)
        assert answer.status == 503
        error = (await answer.json())["error"]
        assert error["code"] == "unavailable" and "127.0.0.1" not in error["message"]


async def test_a_non_json_answer_from_hermes_becomes_a_502_envelope(make_client: ClientFactory) -> None:
    # A tiny stand-in: a reverse proxy in front of Hermes answering an HTML error page
    async def html(_: web.Request) -> web.Response:
        return web.Response(status=502, text="<html>Bad Gateway</html>", content_type="text/html")

    upstream = web.Application()
    upstream.router.add_get("/v1/runs/{tail:.*}", html)
    server = TestServer(upstream)
    await server.start_server()
    try:
        client = await make_client(runs_proxy_enabled=True, hermes_url=str(server.make_url("")).rstrip("/"))
        for path in ("/v1/runs/run_x", "/v1/runs/run_x/events"):
            answer = await client.get(path)
            assert answer.status == 502
            assert answer.content_type == "application/json"
            assert (await answer.json())["error"]["type"] == "server_error"
    finally:
        await server.close()


async def test_shutdown_ends_relayed_streams(proxying: Client, hermes: TestServer) -> None:
    run_id = await hermes_run(hermes, "hello sleep:30")
    reader = SseReader(await proxying.get(f"/v1/runs/{run_id}/events"))
    assert proxying.server.app[metrics_key].sse_open._value.get() == 1
    rest = asyncio.create_task(reader.rest())
    await asyncio.wait_for(proxying.server.close(), timeout=5)
    items = await asyncio.wait_for(rest, timeout=5)
    assert Comment("stream closed") not in items


async def _data(reader: SseReader) -> dict[str, Any]:
    """The payload of the next data frame of a Hermes stream (data-only frames, no ids)."""
    fields: list[bytes] = []
    async with asyncio.timeout(5):
        while (line := await reader.response.content.readline()) != b"":
            if line.startswith(b"data: "):
                fields.append(line[6:])
            elif line == b"\n" and fields:
                value = orjson.loads(b"".join(fields))
                assert isinstance(value, dict)
                return value
    raise AssertionError("the stream ended without a data frame")


async def test_stop_and_approval_of_a_hermes_run_are_relayed(proxying: Client, hermes: TestServer) -> None:
    # Given a run created on Hermes directly that waits for an approval
    run_id = await hermes_run(hermes, "please approval sleep:2")

    async def waiting() -> bool:
        answer = await proxying.get(f"/v1/runs/{run_id}")
        return bool((await answer.json())["status"] == "waiting_for_approval")

    deadline = asyncio.get_running_loop().time() + 10
    while not await waiting():
        assert asyncio.get_running_loop().time() < deadline, "the run never asked for approval"
        await asyncio.sleep(0.02)
    # When its approval and its stop go through the broker, then Hermes's own answers come back
    approved = await proxying.post(f"/v1/runs/{run_id}/approval", json={"choice": "once"})
    assert approved.status == 200
    assert (await approved.json()) == {
        "object": "hermes.run.approval_response",
        "run_id": run_id,
        "choice": "once",
        "resolved": 1,
    }
    stopped = await proxying.post(f"/v1/runs/{run_id}/stop")
    assert stopped.status == 200 and (await stopped.json()) == {"run_id": run_id, "status": "stopping"}


async def test_disabled_proxy_answers_404_for_stop_and_approval(make_client: ClientFactory) -> None:
    client = await make_client()
    for suffix, body in (("/stop", None), ("/approval", {"choice": "once"})):
        answer = await client.post(f"/v1/runs/run_abc{suffix}", json=body)
        assert answer.status == 404
        assert (await answer.json())["error"]["code"] == "run_not_found"


# -- several upstreams (SPEC S10): asked in order, the first answer that is not a 404 relayed ---------------------


@pytest.fixture
async def second() -> AsyncIterator[TestServer]:
    server = TestServer(create_simulator(Settings(keepalive_s=0.5)))
    await server.start_server()
    yield server
    await server.close()


def url(server: TestServer) -> str:
    return str(server.make_url("")).rstrip("/")


async def test_a_run_of_the_second_upstream_is_found_and_relayed_get_events_and_stop(
    make_client: ClientFactory, hermes: TestServer, second: TestServer
) -> None:
    proxying = await make_client(runs_proxy_enabled=True, hermes_url=f"{url(hermes)},{url(second)}")
    run_id = await hermes_run(second, "hello sleep:1")
    answer = await proxying.get(f"/v1/runs/{run_id}")
    assert answer.status == 200 and (await answer.json())["run_id"] == run_id
    events = await proxying.get(f"/v1/runs/{run_id}/events")
    assert events.status == 200 and events.headers["Content-Type"].startswith("text/event-stream")
    assert (await _data(SseReader(events)))["run_id"] == run_id
    events.close()
    stopped = await proxying.post(f"/v1/runs/{run_id}/stop")
    assert stopped.status == 200 and (await stopped.json()) == {"run_id": run_id, "status": "stopping"}
    for path in ("/v1/runs/run_unknown", "/v1/runs/run_unknown/events"):  # no upstream knows it: Hermes's 404
        unknown = await proxying.get(path)
        assert unknown.status == 404 and (await unknown.json())["error"]["code"] == "run_not_found"


async def test_a_404_of_one_upstream_while_another_does_not_answer_is_a_503(
    make_client: ClientFactory, hermes: TestServer
) -> None:
    proxying = await make_client(runs_proxy_enabled=True, hermes_url=f"{url(hermes)},http://127.0.0.1:{free_port()}")
    for path in ("/v1/runs/run_unknown", "/v1/runs/run_unknown/events"):  # the run may be on the silent one
        answer = await proxying.get(path)
        assert answer.status == 503 and (await answer.json())["error"]["code"] == "unavailable"
    run_id = await hermes_run(hermes)  # the first knows this one: its answer, whatever the other does
    assert (await proxying.get(f"/v1/runs/{run_id}")).status == 200
