"""HERMES_MAX_BODY over real HTTP (SPEC S2, S7): a create whose execution body Hermes would refuse answers 413 at
once, in the envelope, naming the limit, and stores nothing."""

from __future__ import annotations

import io
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.http.appkeys import service_key
from tests.integration.conftest import ClientFactory

DEFAULT = 1_048_576  #: HERMES_MAX_BODY by default (SPEC S2)
EMPTY = len(b'{"input":""}')


def _input_body(size: int) -> io.BytesIO:
    """A create whose execution body, as sent to Hermes, is exactly `size` bytes (a stream: aiohttp warns of
    large bytes)."""
    return io.BytesIO(orjson.dumps({"input": "x" * (size - EMPTY)}))


def _no_service(client: TestClient[Any, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the create reaches the service (the only part of a create that speaks Redis)."""

    async def refused(*_: object, **__: object) -> None:
        raise AssertionError("the create reached the service")

    monkeypatch.setattr(client.app[service_key], "create", refused)


async def test_a_create_over_the_default_limit_answers_413_naming_it_and_stores_nothing(
    client: TestClient[Any, Any], redis: Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given the default HERMES_MAX_BODY (1 MiB) and a store that counts its keys
    before = await redis.dbsize()
    _no_service(client, monkeypatch)
    # When a create's execution body is one byte over it
    answer = await client.post("/v1/runs", data=_input_body(DEFAULT + 1), headers={"Idempotency-Key": "k-big"})
    # Then it answers 413 body_too_large in the Hermes envelope, naming the limit, before any Redis command
    assert answer.status == 413
    assert answer.content_type == "application/json"
    message = (
        f"The body sent to Hermes would be {DEFAULT + 1} bytes, over the limit of {DEFAULT} bytes (HERMES_MAX_BODY)"
    )
    assert await answer.json() == {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": "body_too_large"}
    }
    assert await redis.dbsize() == before


async def test_a_refused_create_leaves_its_idempotency_key_free(client: TestClient[Any, Any]) -> None:
    # Given a create refused for its size
    refused = await client.post("/v1/runs", data=_input_body(DEFAULT + 1), headers={"Idempotency-Key": "k-free"})
    assert refused.status == 413
    # When a create within the limit uses the same key, then it creates the job
    answer = await client.post("/v1/runs", data=_input_body(DEFAULT), headers={"Idempotency-Key": "k-free"})
    assert answer.status == 202
    assert (await answer.json())["replayed"] is False


async def test_the_configured_limit_is_the_one_applied(make_client: ClientFactory) -> None:
    # Given a broker configured with HERMES_MAX_BODY=2000
    client = await make_client(hermes_max_body=2000)
    # When creates of exactly 2000 and of 2001 bytes arrive
    at_limit = await client.post("/v1/runs", data=_input_body(2000))
    over = await client.post("/v1/runs", data=_input_body(2001))
    # Then the first is a job and the second a 413 naming 2000
    assert at_limit.status == 202
    assert over.status == 413
    assert "limit of 2000 bytes" in (await over.json())["error"]["message"]


async def test_what_counts_is_the_body_hermes_would_get(make_client: ClientFactory) -> None:
    # Given a broker configured with HERMES_MAX_BODY=2000
    client = await make_client(hermes_max_body=2000)
    # When a large request carries its bulk in fields the broker keeps or ignores, it is a job
    kept = {"input": "hi", "context": {"title": "t" * 500}, "ignored": "y" * 50_000}
    assert (await client.post("/v1/runs", data=orjson.dumps(kept))).status == 202
    # But a small input with a large forwarded conversation_history is refused
    history = {"input": "hi", "conversation_history": [{"role": "user", "content": "h" * 2000}]}
    answer = await client.post("/v1/runs", data=orjson.dumps(history))
    assert answer.status == 413
    assert (await answer.json())["error"]["code"] == "body_too_large"
