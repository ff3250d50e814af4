"""The `hermes` target fixture: every contract test runs against the simulator and the real Hermes 0.19.0."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.app import create_app
from broker.config import Config
from broker.hermes import AiohttpHermesClient
from tests.conftest import RedisServer
from tests.contract.harness import HarnessError, Target, start_target

REQUEST_TIMEOUT_MS = 10_000


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("sim"),
        # The first real run installs hermes-agent into its own virtualenv, hence the long timeout.
        pytest.param("real", marks=[pytest.mark.real_hermes, pytest.mark.timeout(300)]),
    ],
)
def hermes(request: pytest.FixtureRequest) -> Iterator[Target]:
    try:
        target, workdir = start_target(request.param)
    except (HarnessError, OSError, subprocess.SubprocessError) as exc:
        reason = f"could not start the {request.param} Hermes target: {exc}"
        if os.environ.get("CI") or request.param == "sim":  # the simulator is ours: it must always start
            pytest.fail(reason)
        print(reason)
        pytest.skip(reason)
    yield target
    target.close()
    workdir.cleanup()


@pytest.fixture
async def client(hermes: Target) -> AsyncIterator[AiohttpHermesClient]:
    client = AiohttpHermesClient(hermes.base_url, hermes.api_key, REQUEST_TIMEOUT_MS)
    yield client
    await client.aclose()


@pytest.fixture
async def broker(aiohttp_client: Any, hermes: Target, redis_server: RedisServer, redis: Redis) -> TestClient[Any, Any]:
    config = Config(
        redis_url=redis_server.url,
        hermes_url=hermes.base_url,
        hermes_api_key=hermes.api_key,
        runs_poll_interval_ms=250,
        runs_backoff_ms=200,
        runs_backoff_max_ms=1_000,
    )
    client: TestClient[Any, Any] = await aiohttp_client(create_app(config))
    return client
