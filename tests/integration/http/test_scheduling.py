"""`scheduling` on create (SPEC S3.1, S3.2, S4.2) over real HTTP and Redis: resolved defaults, the configured source
of a job's key, configured weights, replays, the listing and the console; never part of the execution body."""

from __future__ import annotations

import html
from typing import Any

import orjson
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.store import keys
from broker.store.jobs import JobStore
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory

pytestmark = BOTH_BACKENDS

Client = TestClient[Any, Any]
DEFAULT = {"priority": 3, "fairness_key": "", "fairness_weight": 1.0, "multitask": "enqueue"}


async def create(client: Client, body: dict[str, Any], **headers: str) -> dict[str, Any]:
    answer = await client.post("/v1/runs", json=body, headers=headers)
    assert answer.status == 202, await answer.text()
    document: dict[str, Any] = await answer.json()
    return document


async def test_scheduling_is_stored_resolved_and_shown_but_never_forwarded(client: Client, redis: Redis) -> None:
    # When a create names all three, an integer weight and an unknown inner field
    body = {"input": "x", "scheduling": {"priority": 1, "fairness_key": "team-a", "fairness_weight": 2, "x": 1}}
    job = await create(client, body, **{"X-Hermes-Session-Key": "user-7"})
    # Then the job shows them resolved (the weight a number), the poll and the listing too
    assert job["scheduling"] == {
        "priority": 1,
        "fairness_key": "team-a",
        "fairness_weight": 2.0,
        "multitask": "enqueue",
    }
    polled = await (await client.get(f"/v1/runs/{job['run_id']}")).json()
    assert polled["scheduling"] == job["scheduling"]
    listed = (await (await client.get("/v1/runs")).json())["data"]
    assert [entry["scheduling"] for entry in listed] == [job["scheduling"]]
    # and the execution body Hermes gets has none of it
    body_sent = await JobStore(redis, retention_ms=60_000).execution_body(job["run_id"])
    assert orjson.loads(body_sent) == {"input": "x"}
    # and the console's job page shows it
    page = html.unescape(await (await client.get(f"/console/jobs/{job['run_id']}")).text())
    assert '"fairness_key":"team-a"' in page


async def test_the_default_key_is_the_session_key_unless_configured_otherwise(make_client: ClientFactory) -> None:
    long_key = "user " * 50 + "x" * 6  # 256 characters, spaces inside: a header's key is used as it is
    by_key = await make_client()
    assert (await create(by_key, {"input": "x"}, **{"X-Hermes-Session-Key": long_key}))["scheduling"] == {
        **DEFAULT,
        "fairness_key": long_key,
    }
    assert (await create(by_key, {"input": "x", "session_id": "s-1"}))["scheduling"] == DEFAULT
    named = {"input": "x", "scheduling": {"fairness_key": "mine"}}
    assert (await create(by_key, named, **{"X-Hermes-Session-Key": "u"}))["scheduling"]["fairness_key"] == "mine"
    by_id = await make_client(admission_fairness_default="session_id")
    job = await create(by_id, {"input": "x", "session_id": "s-1"}, **{"X-Hermes-Session-Key": "u"})
    assert job["scheduling"]["fairness_key"] == "s-1"
    nobody = await make_client(admission_fairness_default="none")
    job = await create(nobody, {"input": "x", "session_id": "s-1"}, **{"X-Hermes-Session-Key": "u"})
    assert job["scheduling"] == DEFAULT


async def test_a_configured_weight_wins_over_the_creates(make_client: ClientFactory) -> None:
    client = await make_client(admission_fairness_weights=(("team-a", 3.0), ("user-1", 0.5)))
    named = {"input": "x", "scheduling": {"fairness_key": "team-a", "fairness_weight": 9}}
    assert (await create(client, named))["scheduling"]["fairness_weight"] == 3.0
    from_header = await create(client, {"input": "x"}, **{"X-Hermes-Session-Key": "user-1"})
    assert from_header["scheduling"] == {**DEFAULT, "fairness_key": "user-1", "fairness_weight": 0.5}
    other = {"input": "x", "scheduling": {"fairness_key": "team-b", "fairness_weight": 9}}
    assert (await create(client, other))["scheduling"]["fairness_weight"] == 9.0


async def test_a_replay_changes_nothing(client: Client, redis: Redis) -> None:
    first = await create(client, {"input": "x", "scheduling": {"priority": 2}}, **{"Idempotency-Key": "k-1"})
    line = keys.line(keys.partition_of(first["run_id"]))
    place = await redis.zscore(line, first["run_id"])
    again = await create(
        client,
        {"input": "x", "scheduling": {"priority": 5, "fairness_key": "z"}},
        **{"Idempotency-Key": "k-1", "X-Hermes-Session-Key": "u"},
    )
    assert again["replayed"] is True and again["scheduling"] == first["scheduling"]
    assert first["scheduling"] == {**DEFAULT, "priority": 2}
    assert await redis.zscore(line, first["run_id"]) == place
    assert await redis.zcard(line) == 1
