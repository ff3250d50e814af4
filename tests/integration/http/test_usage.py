"""GET /v1/usage (SPEC S4.5): a key's buckets by hour or day, the top keys, and a 400 naming each bad parameter."""

from __future__ import annotations

import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.store.usage import UsageStore, hour_of
from projections.usage import Used

FIELDS = {
    "runs_started",
    "runs_completed",
    "runs_failed",
    "runs_cancelled",
    "hermes_seconds",
    "input_tokens",
    "output_tokens",
    "total_tokens",
}


async def given_usage(redis: Redis, now_ms: int) -> int:
    """Three keys' runs: `team-a` two hours ago and now, `team-b` now, the empty key now; the current hour's start."""
    store = UsageStore(redis, retention_ms=7 * 86_400_000)
    earlier = now_ms - 2 * 3_600_000
    counted = await store.count(
        [
            Used(marker="j1:1:a", key="team-a", at_ms=earlier, runs_started=1),
            Used(marker="j1:end", key="team-a", at_ms=earlier, runs_completed=1, hermes_ms=4_000, total_tokens=9),
            Used(marker="j2:1:a", key="team-a", at_ms=now_ms, runs_started=1),
            Used(marker="j2:end", key="team-a", at_ms=now_ms, runs_failed=1, hermes_ms=1_500),
            Used(marker="j3:1:a", key="team-b", at_ms=now_ms, runs_started=1),
            Used(
                marker="j3:end",
                key="team-b",
                at_ms=now_ms,
                runs_completed=1,
                hermes_ms=20_250,
                input_tokens=5,
                output_tokens=6,
                total_tokens=11,
            ),
            Used(marker="j4:1:a", key="", at_ms=now_ms, runs_started=1),
        ]
    )
    assert all(counted)
    return hour_of(now_ms)


async def get(client: TestClient[Any, Any], query: str) -> tuple[int, dict[str, Any]]:
    response = await client.get(f"/v1/usage{query}")
    body: dict[str, Any] = await response.json()
    return response.status, body


async def test_a_keys_hourly_buckets_cover_the_last_day(client: TestClient[Any, Any], redis: Redis) -> None:
    now_ms = int(time.time() * 1000)
    hour = await given_usage(redis, now_ms)
    status, body = await get(client, "?key=team-a")
    assert status == 200 and body["object"] == "usage" and body["key"] == "team-a"
    starts = [bucket["start"] for bucket in body["data"]]
    assert starts == list(range(starts[0], hour + 1, 3600)) and len(starts) in (24, 25)
    assert all(set(bucket) == FIELDS | {"start"} for bucket in body["data"])
    by_start = {bucket["start"]: bucket for bucket in body["data"]}
    assert by_start[hour - 7200] == {
        "start": hour - 7200,
        "runs_started": 1,
        "runs_completed": 1,
        "runs_failed": 0,
        "runs_cancelled": 0,
        "hermes_seconds": 4.0,
        "input_tokens": 0,
        "output_tokens": 0,
        "total_tokens": 9,
    }
    assert by_start[hour]["runs_failed"] == 1 and by_start[hour]["hermes_seconds"] == 1.5
    assert sum(bucket["runs_started"] for bucket in body["data"]) == 2


async def test_day_buckets_and_a_range(client: TestClient[Any, Any], redis: Redis) -> None:
    now_ms = int(time.time() * 1000)
    hour = await given_usage(redis, now_ms)
    status, body = await get(client, f"?key=team-a&bucket=day&since={hour - 7200}&until={hour + 1}")
    assert status == 200
    assert all(bucket["start"] % 86_400 == 0 for bucket in body["data"])
    assert sum(bucket["runs_started"] for bucket in body["data"]) == 2
    assert round(sum(bucket["hermes_seconds"] for bucket in body["data"]), 3) == 5.5
    status, body = await get(client, f"?key=team-a&since={hour}&until={hour + 3600}")
    assert [bucket["start"] for bucket in body["data"]] == [hour] and body["data"][0]["runs_started"] == 1


async def test_the_top_keys_by_hermes_seconds(client: TestClient[Any, Any], redis: Redis) -> None:
    await given_usage(redis, int(time.time() * 1000))
    status, body = await get(client, "")
    assert status == 200 and body["object"] == "usage" and "key" not in body
    assert [entry["key"] for entry in body["data"]] == ["team-b", "team-a", ""]
    assert set(body["data"][0]) == FIELDS | {"key"}
    assert body["data"][0] == {
        "key": "team-b",
        "runs_started": 1,
        "runs_completed": 1,
        "runs_failed": 0,
        "runs_cancelled": 0,
        "hermes_seconds": 20.25,
        "input_tokens": 5,
        "output_tokens": 6,
        "total_tokens": 11,
    }
    assert body["data"][1]["runs_started"] == 2 and body["data"][1]["hermes_seconds"] == 5.5
    status, body = await get(client, "?limit=1")
    assert [entry["key"] for entry in body["data"]] == ["team-b"]
    status, body = await get(client, "?key=")  # the empty key: every job without one
    assert body["key"] == "" and sum(bucket["runs_started"] for bucket in body["data"]) == 1
    status, body = await get(client, "?key=nobody")
    assert status == 200 and all(bucket["runs_started"] == 0 for bucket in body["data"])


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("?since=yesterday", "since"),
        ("?until=-5", "until"),
        ("?since=nan", "since"),
        ("?since=42%0A", "since"),
        ("?until=%2042", "until"),
        ("?since=1_000", "since"),
        ("?since=200&until=100", "since"),
        ("?bucket=week", "bucket"),
        ("?limit=0", "limit"),
        ("?limit=1001", "limit"),
        ("?limit=ten", "limit"),
        ("?key=" + "k" * 257, "key"),
    ],
)
async def test_a_bad_parameter_is_a_400_naming_it(client: TestClient[Any, Any], query: str, param: str) -> None:
    status, body = await get(client, query)
    assert status == 400
    error = body["error"]
    assert (error["code"], error["param"], error["type"]) == ("invalid_field", param, "invalid_request_error")
    assert param in error["message"]
