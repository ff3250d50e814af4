"""A Redis outage answers 503 `unavailable` with Retry-After on every route, and logs a warning without a
traceback; a bug keeps its 500 and its traceback (SPEC S9: a failover is a 503, never a 500)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from broker.app import create_app
from broker.config import Config
from broker.http.errors import error_middleware
from tests.conftest import RedisServer
from tests.unit.store.test_outage import TABLE


@pytest.mark.parametrize(("error", "outage"), TABLE, ids=lambda value: type(value).__name__)
async def test_each_failure_answers_as_classified(
    aiohttp_client: Any, caplog: pytest.LogCaptureFixture, error: BaseException, outage: bool
) -> None:
    async def failing(_: web.Request) -> web.Response:
        raise error

    app = web.Application(middlewares=[error_middleware])
    app.router.add_post("/v1/runs", failing)
    client = await aiohttp_client(app)
    with caplog.at_level(logging.WARNING, logger="broker.http.errors"):
        answer = await client.post("/v1/runs", json={"input": "x"})
    body = await answer.json()
    logged = [record for record in caplog.records if record.name == "broker.http.errors.ErrorMiddleware"]
    if outage:
        assert answer.status == 503 and body["error"]["code"] == "unavailable", body
        assert int(answer.headers["Retry-After"]) >= 1
        assert [(record.levelname, record.message) for record in logged] == [
            ("WARNING", "Redis could not answer a request.")
        ]
        assert logged[0].exc_info is None
    elif answer.status == 500:
        assert body["error"] == {
            "message": "The broker failed to answer this request",
            "type": "server_error",
            "param": None,
            "code": "internal_error",
        }
        assert [(record.levelname, record.message) for record in logged] == [("ERROR", "Failed to answer a request.")]
        assert logged[0].exc_info is not None  # a bug keeps its traceback
    else:  # the broker's own answers (400, a 503 `busy`) are neither outages nor bugs
        assert answer.status in (400, 503) and body["error"]["code"] != "unavailable" and logged == []


async def test_every_route_answers_503_while_redis_is_down(aiohttp_client: Any, tmp_path: Path) -> None:
    # Given a broker on a Redis of its own, with a job
    server = RedisServer(tmp_path)
    server.start()
    try:
        client = await aiohttp_client(create_app(Config(redis_url=server.url, runs_event_block_ms=500)))
        created = await client.post("/v1/runs", json={"input": "x"})
        job = (await created.json())["run_id"]
    finally:
        # When Redis goes away
        server.stop(kill=True)
    # Then every route that needs it answers a 503 `unavailable` to retry, in the envelope
    calls = {
        "create": client.post("/v1/runs", json={"input": "y"}),
        "get": client.get(f"/v1/runs/{job}"),
        "events": client.get(f"/v1/runs/{job}/events"),
        "stop": client.post(f"/v1/runs/{job}/stop"),
        "approval": client.post(f"/v1/runs/{job}/approval", json={"choice": "once"}),
        "list": client.get("/v1/runs"),
        "console": client.get(f"/console/jobs/{job}"),
    }
    answers = dict(zip(calls, await asyncio.gather(*calls.values()), strict=True))
    for route, answer in answers.items():
        body = await answer.json()
        assert answer.status == 503, (route, body)
        assert body["error"]["code"] == "unavailable" and body["error"]["type"] == "server_error", (route, body)
        assert answer.headers["Retry-After"] == "1", route
