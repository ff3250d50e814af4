"""Usage (SPEC S4.5) recorded by driving replicas against the simulator: buckets per fairness key, counted once."""

from __future__ import annotations

import time
from typing import Any

from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.store import keys
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, settled

pytestmark = BOTH_BACKENDS


async def usage(client: TestClient[Any, Any], **params: str) -> dict[str, Any]:
    response = await client.get("/v1/usage", params=params)
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


def totals(body: dict[str, Any]) -> dict[str, Any]:
    """The key's buckets summed (the Hermes seconds rounded)."""
    summed: dict[str, Any] = {}
    for bucket in body["data"]:
        for name, value in bucket.items():
            if name != "start":
                summed[name] = summed.get(name, 0) + value
    summed["hermes_seconds"] = round(summed.get("hermes_seconds", 0), 3)
    return summed


async def pending_facts(redis: Redis) -> int:
    return sum([await redis.zcard(keys.usage_pending(partition)) for partition in keys.partitions()])


async def test_each_keys_runs_are_counted_by_status_with_seconds_and_tokens(
    make_replica: ClientFactory, redis: Redis
) -> None:
    # Given a replica driving jobs of two fairness keys: completed, failed and stopped runs
    replica = await make_replica()
    team_a = {"scheduling": {"fairness_key": "team-a"}}
    jobs = [
        (await create(replica, {"input": "hello", **team_a}))["run_id"],
        (await create(replica, {"input": "tools:1", **team_a}))["run_id"],
        (await create(replica, {"input": "fail", **team_a}))["run_id"],
        (await create(replica, {"input": "hello", "scheduling": {"fairness_key": "team-b"}}))["run_id"],
    ]
    ended = [await settled(replica, job_id) for job_id in jobs]
    assert [job["status"] for job in ended] == ["completed", "completed", "failed", "completed"]
    # When the sweep has counted what the job writes left
    await eventually(lambda: _none_pending(redis))
    body = await usage(replica, key="team-a")
    # Then team-a's hourly buckets hold its three runs and the two completed runs' tokens
    assert body["object"] == "usage" and body["key"] == "team-a"
    assert all(set(bucket) >= {"start", "runs_started", "hermes_seconds"} for bucket in body["data"])
    summed = totals(body)
    assert summed["runs_started"] == 3
    assert (summed["runs_completed"], summed["runs_failed"], summed["runs_cancelled"]) == (2, 1, 0)
    assert summed["input_tokens"] == 11 + 22 and summed["output_tokens"] == 7 + 14 and summed["total_tokens"] == 54
    assert summed["hermes_seconds"] > 0
    # And the top keys put each key once, with its totals over the day
    top = await usage(replica)
    assert [entry["key"] for entry in top["data"]] == sorted(
        ["team-a", "team-b"], key=lambda key: -next(e["hermes_seconds"] for e in top["data"] if e["key"] == key)
    )
    entry_a = next(entry for entry in top["data"] if entry["key"] == "team-a")
    assert {name: entry_a[name] for name in summed if name != "hermes_seconds"} == {
        name: value for name, value in summed.items() if name != "hermes_seconds"
    }
    assert round(entry_a["hermes_seconds"], 3) == summed["hermes_seconds"]
    # And a day bucket holds the same as the hours
    day = await usage(replica, key="team-a", bucket="day", since=str(time.time() - 3600))
    assert totals(day)["runs_started"] == 3


async def _none_pending(redis: Redis) -> bool:
    return await pending_facts(redis) == 0
