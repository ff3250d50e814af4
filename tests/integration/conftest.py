"""Integration fixtures: the broker app over real HTTP on loopback, against the session redis-server."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.app import create_app
from broker.clock import Clock
from broker.config import Config

ClientFactory = Callable[..., Awaitable[TestClient[Any, Any]]]


@pytest.fixture
def config(redis_target: tuple[str, bool]) -> Config:
    url, cluster = redis_target
    return Config(redis_url=url, redis_cluster=cluster, runs_event_block_ms=500)


@pytest.fixture
def make_client(aiohttp_client: Any, config: Config, redis: Redis) -> ClientFactory:
    """Start another broker app (a replica) sharing the session Redis; `overrides` change its config.

    The app does not drive jobs unless `drive=True` (then its Hermes is `config.hermes_url`); `clock`: its time (the
    system's by default)."""

    async def make(*, drive: bool = False, clock: Clock | None = None, **overrides: Any) -> TestClient[Any, Any]:
        app = create_app(config.with_(**overrides), drive=drive, clock=clock)
        client: TestClient[Any, Any] = await aiohttp_client(app)
        return client

    return make


@pytest.fixture
async def client(make_client: ClientFactory) -> TestClient[Any, Any]:
    return await make_client()
