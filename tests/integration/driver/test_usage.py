"""Usage (SPEC S4.5) recorded by driving replicas against the simulator: buckets per fairness key, counted once."""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp.test_utils import TestClient
from attrs import evolve
from redis.asyncio import Redis

from broker.clock import SystemClock
from broker.events import JobCreated, JobFinished, JobStatus, RunAccepted, Scheduling
from broker.jobs.writer import Writer
from broker.metrics import Metrics
from broker.store import keys
from broker.store.jobs import JobStore
from broker.store.usage import UsageStore, encode
from projections.job import fold
from projections.usage import facts
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, settled
from tests.integration.driver.test_rebuild import rebuild

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
        (await create(replica, {"input": "hello tokens:300", "scheduling": {"fairness_key": "team-b"}}))["run_id"],
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
    # And /metrics has the totals without a key (this replica counted every run)
    exported = metrics(await (await replica.get("/metrics")).text())
    assert exported['hbr_tokens_total{kind="total"}'] == 54 + 300  # team-b's run reported `tokens:300`
    assert exported['hbr_tokens_total{kind="input"}'] == 33 + 200
    assert abs(exported["hbr_hermes_seconds_total"] - sum(entry["hermes_seconds"] for entry in top["data"])) < 0.01
    assert not any("team-a" in name for name in exported)


def metrics(text: str) -> dict[str, float]:
    """The samples of a /metrics answer by their name and labels."""
    samples = (line.rpartition(" ") for line in text.splitlines() if line and not line.startswith("#"))
    return {name: float(value) for name, _, value in samples}


async def _none_pending(redis: Redis) -> bool:
    return await pending_facts(redis) == 0


async def test_facts_read_again_and_a_replayed_create_are_counted_once(
    make_replica: ClientFactory, redis: Redis
) -> None:
    # Given two replicas, and a key's jobs settled and counted
    first, second = await make_replica(), await make_replica()
    body = {"input": "hello", "scheduling": {"fairness_key": "team-r"}}
    jobs = [(await create(first, body, **{"Idempotency-Key": f"k-{n}"}))["run_id"] for n in range(3)]
    for job_id in jobs:
        await settled(first, job_id)
    await eventually(lambda: _none_pending(redis))
    before = await usage(second, key="team-r")
    assert totals(before)["runs_completed"] == 3

    async def all_exported() -> list[float] | None:  # a sweep adds to the totals just after it clears the facts
        found = [await exported_tokens(replica) for replica in (first, second)]
        return found if sum(found) == 3 * 18 else None

    exported = await eventually(all_exported)  # each run in the totals of the one replica that counted it
    # When every fact is left for the sweeps again (as a sweep cut short before it cleared them leaves it) and a
    # create is replayed
    for job_id in jobs:
        history = await JobStore(redis, retention_ms=60_000).read(job_id)
        for used in facts(None, [event for _, event in history]):
            await redis.zadd(keys.usage_pending(keys.partition_of(job_id)), {encode(used): used.at_ms})
    replayed = await first.post("/v1/runs", json=body, headers={"Idempotency-Key": "k-0"})
    assert replayed.status == 202 and (await replayed.json())["replayed"] is True
    await eventually(lambda: _none_pending(redis))
    # Then both replicas' sweeps took them and nothing was counted twice, in the buckets or the totals
    assert await usage(first, key="team-r") == before
    assert [await exported_tokens(replica) for replica in (first, second)] == exported


async def exported_tokens(replica: TestClient[Any, Any]) -> float:
    return metrics(await (await replica.get("/metrics")).text())['hbr_tokens_total{kind="total"}']


async def test_the_rebuild_recomputes_the_same_buckets(
    make_replica: ClientFactory, redis: Redis, redis_target: tuple[str, bool]
) -> None:
    # Given settled jobs of two keys, counted
    replica = await make_replica()
    for key, text in (("team-x", "hello"), ("team-x", "fail"), ("team-y", "tools:2")):
        await settled(replica, (await create(replica, {"input": text, "scheduling": {"fairness_key": key}}))["run_id"])
    await eventually(lambda: _none_pending(redis))
    counted = {key: await usage(replica, key=key) for key in ("team-x", "team-y")}
    top = await usage(replica)
    code, lines = await rebuild(redis_target)
    assert code == 0 and lines[-1]["differing"] == 0, lines
    # When one bucket is corrupted and another key's usage is lost
    hour = next(bucket["start"] for bucket in counted["team-x"]["data"] if bucket["runs_started"])
    await redis.hset(keys.usage(hour).counters, "team-x", "9,9,9,9,9,9,9,9")  # type: ignore[misc]
    await redis.hdel(keys.usage(hour).counters, "team-y")  # type: ignore[misc]
    # Then a dry run names both buckets and changes nothing
    code, lines = await rebuild(redis_target)
    found = sorted(line["usage"]["key"] for line in lines if "usage" in line)  # type: ignore[index]
    assert code == 1 and found == ["team-x", "team-y"]
    assert totals(await usage(replica, key="team-x"))["runs_started"] != totals(counted["team-x"])["runs_started"]
    # And --write recomputes the same buckets the sweeps counted
    code, lines = await rebuild(redis_target, "--write")
    assert code == 0 and all(line["replaced"] for line in lines if "usage" in line), lines
    assert {key: await usage(replica, key=key) for key in ("team-x", "team-y")} == counted
    assert await usage(replica) == top
    code, lines = await rebuild(redis_target)
    assert code == 0 and lines[-1]["differing"] == 0


async def test_a_run_an_older_broker_accepted_is_counted_from_its_stream(
    redis: Redis, redis_target: tuple[str, bool]
) -> None:
    # Given a job an older broker created and saw accepted: no usage facts, a view without the acceptance time
    store = JobStore(redis, retention_ms=3_600_000)
    now = int(time.time() * 1000)
    created = JobCreated(
        job_id=OLD_JOB, at_ms=now - 5_000, body="{}", fingerprint="f", scheduling=Scheduling(fairness_key="old")
    )
    accepted = RunAccepted(job_id=OLD_JOB, at_ms=now - 4_000, attempt=1, hermes_run_id="run_1")
    view = fold([created, accepted])
    assert view is not None
    start = fold([created])
    assert start is not None
    first = await store.create(created, start)
    older_view = evolve(view, live_since_ms=None)  # what that broker stored
    await store.append(OLD_JOB, [accepted], older_view, expected_last_id=first.snapshot.last_id)
    # When this version records the run's end
    writer = Writer(store, SystemClock(), Metrics(), None)
    snapshot = await writer.load(OLD_JOB)
    usage_text = '{"input_tokens": 2, "output_tokens": 1, "total_tokens": 3}'
    end = JobFinished(job_id=OLD_JOB, at_ms=now, status=JobStatus.COMPLETED, attempt=1, usage=usage_text)
    await writer.commit(OLD_JOB, snapshot, lambda _: [end], log=logging.getLogger("test"))
    # Then the fact it leaves has the Hermes time from the acceptance its stream records
    [pending] = (await UsageStore(redis, retention_ms=3_600_000).pending()) or [None]
    assert pending is not None and pending.used is not None
    assert (pending.used.marker, pending.used.hermes_ms, pending.used.total_tokens) == (f"{OLD_JOB}:end", 4_000, 3)
    # And the rebuild counts the start that broker never recorded, and leaves the end to the sweeps
    code, lines = await rebuild(redis_target, "--write")
    assert code == 0 and [line["usage"]["key"] for line in lines if "usage" in line] == ["old"]  # type: ignore[index]
    [hour] = {line["usage"]["hour"] for line in lines if "usage" in line}  # type: ignore[index]
    assert await UsageStore(redis, retention_ms=3_600_000).buckets("old", [hour]) == [(1, 0, 0, 0, 0, 0, 0, 0)]


OLD_JOB = "job_" + "0" * 31 + "d"
