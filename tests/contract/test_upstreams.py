"""Several Hermes deployments (SPEC S10) against both Hermes targets: two servers of the same kind (two simulators,
or two real hermes-agent 0.19.0 with their own API keys) behind one broker. A session's turns stay where its
transcript is; stop and approval reach the server of the run, with that server's key."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.app import create_app
from broker.config import Config
from tests.conftest import RedisServer
from tests.contract.harness import HarnessError, Target, start_target
from tests.contract.test_driving import TERMINAL, status_in, until


@pytest.fixture
def other(hermes: Target) -> Iterator[Target]:
    """A second server of the same kind as `hermes`, with its own API key."""
    try:
        target, workdir = start_target(hermes.name)
    except (HarnessError, OSError, subprocess.SubprocessError) as exc:
        pytest.fail(f"could not start a second {hermes.name} Hermes target: {exc}")
    yield target
    target.close()
    workdir.cleanup()


@pytest.fixture
async def fleet(
    aiohttp_client: Any, hermes: Target, other: Target, redis_server: RedisServer, redis: Redis
) -> TestClient[Any, Any]:
    config = Config(
        redis_url=redis_server.url,
        hermes_url=f"{hermes.base_url},{other.base_url}",
        hermes_api_key=f"{hermes.api_key},{other.api_key}",
        runs_poll_interval_ms=250,
        runs_backoff_ms=200,
        runs_backoff_max_ms=1_000,
    )
    client: TestClient[Any, Any] = await aiohttp_client(create_app(config))
    return client


def name_of(target: Target) -> str:
    return target.base_url.removeprefix("http://")


async def hermes_get(target: Target, path: str) -> tuple[int, Any]:
    """GET a path of one Hermes server directly, with its key."""
    headers = {"Authorization": f"Bearer {target.api_key}"}
    async with aiohttp.ClientSession() as session, session.get(f"{target.base_url}{path}", headers=headers) as got:
        return got.status, await got.json(content_type=None)


async def create(client: TestClient[Any, Any], body: dict[str, Any]) -> str:
    answer = await client.post("/v1/runs", json=body)
    assert answer.status == 202, await answer.text()
    job_id: str = (await answer.json())["run_id"]
    return job_id


async def test_a_sessions_turns_run_on_the_server_that_holds_its_transcript(
    fleet: TestClient[Any, Any], hermes: Target, other: Target
) -> None:
    session = f"s-{uuid.uuid4().hex[:12]}"
    targets = {name_of(hermes): hermes, name_of(other): other}
    # Given a session's first turn, run wherever the line sent it
    first = await until(
        status_in(fleet, await create(fleet, {"input": "Turn one.", "session_id": session}), *TERMINAL), 60
    )
    assert first["status"] == "completed" and first["upstream"] in targets
    home, away = targets[first["upstream"]], next(t for n, t in targets.items() if n != first["upstream"])
    # When two more turns of the session arrive, with a loose job taking the first slot between them
    loose = await create(fleet, {"input": "No session here sleep:2"})
    turns = [await create(fleet, {"input": f"Turn {n}.", "session_id": session}) for n in (2, 3)]
    done = [await until(status_in(fleet, job_id, *TERMINAL), 60) for job_id in turns]
    await until(status_in(fleet, loose, *TERMINAL), 60)
    # Then every turn ran on the session's server: its Hermes run is there, and not on the other server
    for turn in [first, *done]:
        assert turn["status"] == "completed" and turn["upstream"] == first["upstream"]
        assert (await hermes_get(home, f"/v1/runs/{turn['hermes_run_id']}"))[0] == 200
        assert (await hermes_get(away, f"/v1/runs/{turn['hermes_run_id']}"))[0] == 404
    if hermes.name == "real":  # and the real Hermes keeps the whole transcript under the session id (api §7)
        status, messages = await hermes_get(home, f"/api/sessions/{session}/messages")
        assert status == 200, messages
        said = str(messages)
        assert all(f"Turn {word}." in said for word in ("one", "2", "3")), said
        assert (await hermes_get(away, f"/api/sessions/{session}/messages"))[0] != 200


async def test_stop_and_approval_reach_the_server_of_the_run_with_its_key(
    fleet: TestClient[Any, Any], hermes: Target, other: Target
) -> None:
    # Given a long job on the first server, then two more: the line sends them to the emptier second server
    long = await create(fleet, {"input": "Take your time sleep:8"})
    await until(status_in(fleet, long, "running"), 60)
    stopped = await create(fleet, {"input": "Take your time too sleep:8"})
    gated = await create(fleet, {"input": "Clean up please approval"})
    running = await until(status_in(fleet, stopped, "running"), 60)
    waiting = await until(status_in(fleet, gated, "waiting_for_approval", *TERMINAL), 60)
    assert waiting["status"] == "waiting_for_approval"
    ran_on = {running["upstream"], waiting["upstream"]}
    assert name_of(other) in ran_on  # the second server took work (its own key opened its runs)
    # When the second job is stopped and the approval denied, through the broker
    assert (await fleet.post(f"/v1/runs/{stopped}/stop")).status in (200, 202)
    answer = await fleet.post(f"/v1/runs/{gated}/approval", json={"choice": "deny"})
    assert answer.status == 200, await answer.text()
    # Then both end as asked, and each run's own server says its run ended
    for job_id, code in ((stopped, "stopped"), (gated, "approval_denied")):
        job = await until(status_in(fleet, job_id, *TERMINAL), 60)
        assert job["status"] == "cancelled" and job["error"]["code"] == code
        server = hermes if job["upstream"] == name_of(hermes) else other
        for _ in range(100):  # the server settles the run shortly after it acknowledged the stop
            status, run = await hermes_get(server, f"/v1/runs/{job['hermes_run_id']}")
            if status == 200 and run["status"] in ("cancelled", "failed", "completed"):
                break
            await asyncio.sleep(0.1)
        assert status == 200 and run["status"] in ("cancelled", "failed"), run
    await fleet.post(f"/v1/runs/{long}/stop")
