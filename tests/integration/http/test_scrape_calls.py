"""/readyz and /metrics make a bounded number of Redis calls whatever the number of waiting keys (SPEC S4.2, S3.8),
and the keys with most waiting jobs stay right: counts, weights and order. Calls are counted with MONITOR on the
test's own redis-server (every command a client sends, and every command a script runs, `lua`)."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable
from typing import Any

from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.events import JobCreated, Scheduling
from broker.store import keys
from broker.store.fair_top import FairTopRepair
from broker.store.jobs import JobStore
from broker.store.scripts import Scripts
from projections.job import apply
from tests.integration.conftest import ClientFactory

PARTITIONS = keys.PARTITIONS
MARK = "scrape-calls-end"
#: What a fresh read sends at most: PING, 2 per upstream, one script per partition, one HMGET per partition.
CLIENT_CALLS = 1 + 2 + PARTITIONS + PARTITIONS
#: And what Redis runs at most, the scripts' own commands included (line_figures.lua runs 13 at most while no job is
#: parked: 12 and the EXISTS of the partition's parked jobs).
ALL_CALLS = 1 + 2 + PARTITIONS * (1 + 13) + PARTITIONS


async def _counted(redis: Redis, action: Awaitable[object]) -> collections.Counter[str]:
    """The commands Redis ran while `action` ran, by `tcp` (sent by a client) and `lua` (run by a script)."""
    counts: collections.Counter[str] = collections.Counter()
    async with redis.monitor() as monitor:
        await action  # a coroutine runs only now, under the monitor
        await redis.echo(MARK)
        async for command in monitor.listen():
            if command["command"] == f"ECHO {MARK}":
                return counts
            if command["command"].startswith("INFO"):
                continue  # the memory guard's reading, once a second on its own: no part of a scrape
            counts[command["client_type"]] += 1
    raise AssertionError("the monitor ended")


async def _waiting(redis: Redis, jobs: list[tuple[str, str, float]]) -> None:
    """Jobs (id, fairness key, weight) waiting in the line, through the store's create (its scripts count them)."""
    store = JobStore(redis, retention_ms=3_600_000)

    async def create(job_id: str, key: str, weight: float) -> None:
        scheduling = Scheduling(fairness_key=key, fairness_weight=weight)
        event = JobCreated(job_id=job_id, at_ms=1_000, body="{}", fingerprint="f", scheduling=scheduling)
        view = apply(None, event)
        assert view is not None
        await store.create(event, view)

    for start in range(0, len(jobs), 200):
        await asyncio.gather(*(create(*job) for job in jobs[start : start + 200]))


async def _scrape(client: TestClient[Any, Any], path: str) -> None:
    assert (await client.get(path)).status == 200


async def test_readyz_and_metrics_calls_do_not_grow_with_the_waiting_keys(
    make_client: ClientFactory, redis: Redis
) -> None:
    measured = []
    for total in (100, 5_000):
        # Given `total` waiting jobs of as many fairness keys (the jobs of 100 first, then up to 5,000)
        done = len(measured) and 100
        await _waiting(redis, [(f"job_{i:032x}", f"key-{i}", 1.0) for i in range(done, total)])
        client = await make_client(runs_delta_retention_ms=0)  # nothing else runs beside the scrapes
        await _scrape(client, "/readyz")  # the scripts loaded (a fresh Redis answers NOSCRIPT once)
        # When /readyz, /metrics right after it, and /metrics of another replica are read
        readyz = await _counted(redis, _scrape(client, "/readyz"))
        shared = await _counted(redis, _scrape(client, "/metrics"))
        other = await make_client(runs_delta_retention_ms=0)
        metrics = await _counted(redis, _scrape(other, "/metrics"))
        report = await (await client.get("/readyz")).json()
        assert report["queue_depth"] == total and len(report["admission"]["top_keys"]) == 10
        measured.append((readyz, shared, metrics))
    # Then each read makes the same bounded calls at 100 and at 5,000 keys; /metrics beside /readyz makes none
    for readyz, shared, metrics in measured:
        assert readyz["tcp"] <= CLIENT_CALLS and metrics["tcp"] <= CLIENT_CALLS - 1
        assert readyz["tcp"] + readyz["lua"] <= ALL_CALLS and metrics["tcp"] + metrics["lua"] <= ALL_CALLS
        assert shared == collections.Counter()
    (few, _, few_metrics), (many, _, many_metrics) = measured
    assert many["tcp"] <= few["tcp"] + PARTITIONS  # at most the HMGETs of the keys' counts come in
    assert many_metrics["tcp"] <= few_metrics["tcp"] + PARTITIONS


async def test_the_busiest_keys_have_exact_counts_weights_and_order(client: TestClient[Any, Any], redis: Redis) -> None:
    # Given 3,000 keys of one waiting job each, and keys with more, spread over every partition (a key's jobs land
    # in many partitions, one to three in each: no partition's first keys show their counts whole)
    jobs = [(f"job_{i:032x}", f"one-{i}", 1.0) for i in range(3_000)]
    big = {"a": (150, 2.0), "b": (70, 1.0), "c": (70, 5.0), "d": (40, 1.0), "e": (25, 0.5)}
    big |= {f"m{i}": (20 + 3 * i, 1.0) for i in range(8)}
    n = len(jobs)
    for key, (count, weight) in big.items():
        jobs += [(f"job_{n + i:032x}", key, weight) for i in range(count)]
        n += count
    await _waiting(redis, jobs)
    # When /readyz is read
    admission = (await (await client.get("/readyz")).json())["admission"]
    # Then the first ten keys are the busiest, with their exact counts and weights, most first (ties by name)
    expected = sorted(big.items(), key=lambda item: (-item[1][0], item[0]))[:10]
    assert admission["top_keys"] == [
        {"key": key, "waiting": count, "weight": weight} for key, (count, weight) in expected
    ]
    assert admission["line"] == n


async def test_keys_an_older_broker_counted_alone_are_mended(make_client: ClientFactory, redis: Redis) -> None:
    # Given waiting jobs counted by this version, then the top zsets as an older broker leaves them: missing
    # entries (it counted alone), and entries of keys whose jobs it took (it forgot them in the hash only)
    jobs = [(f"job_{i:032x}", f"one-{i}", 1.0) for i in range(2_000)]
    jobs += [(f"job_{2_000 + i:032x}", "big", 3.0) for i in range(64 * 3)]
    await _waiting(redis, jobs)
    for partition in keys.partitions():
        await redis.zrem(keys.fair_top(partition), "big")
        await redis.zadd(keys.fair_top(partition), {"gone": 99})
    client = await make_client()
    # When /readyz is read before the zsets are mended: the counts it shows are the hash's, a gone key is not shown
    before = (await (await client.get("/readyz")).json())["admission"]["top_keys"]
    assert "gone" not in {entry["key"] for entry in before}
    # And after a replica mended them (what a driving replica does when it starts, then slice by slice)
    assert await FairTopRepair(redis, Scripts(redis).fair_top_repair).all() == 64 * 2
    after = (await (await client.get("/readyz")).json())["admission"]["top_keys"]
    # Then the key the older broker counted is first again, with its count and weight, and the gone one is gone
    assert after[0] == {"key": "big", "waiting": 64 * 3, "weight": 3.0}
    assert [await redis.zscore(keys.fair_top(p), "gone") for p in keys.partitions()] == [None] * PARTITIONS
