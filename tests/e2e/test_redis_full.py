"""A flood of creates into a Redis with a small maxmemory (SPEC S4.4, S9): it ends in 202s and 503s only, never a
500, and every accepted job reaches its end: the broker stops taking jobs while the accepted ones keep room."""

from __future__ import annotations

import collections
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis

from tests.conftest import SMALL_MAXMEMORY, LocalCluster, RedisServer
from tests.e2e.conftest import BrokerFactory, BrokerProcess, SimulatorProcess, Store, until

CREATES = 1_500
CLIENTS = 16
BODY = {"input": "sleep:0.2 " + "x" * 3_000}  # a few KB each, a short run
TERMINAL = ("completed", "failed", "cancelled")


@pytest.fixture(params=["single", "cluster"])
def small_store(request: pytest.FixtureRequest) -> Iterator[tuple[Store, list[RedisServer]]]:
    """A store with a small maxmemory under noeviction, and its masters: a redis-server of its own, or the session
    cluster with SMALL_MAXMEMORY / 2 above what each master holds, so the flood fills it as it fills the single one
    (set back to none afterwards)."""
    if request.param == "single":
        server: RedisServer = request.getfixturevalue("small_redis")
        yield Store(server.url, {}), [server]
        return
    cluster: LocalCluster = request.getfixturevalue("redis_cluster")
    cluster.wait_ok()
    cluster.flush()
    masters = cluster.masters()
    for master in masters:
        with redis.Redis.from_url(master.url) as client:
            used = int(client.info("memory")["used_memory"])
            client.config_set("maxmemory-policy", "noeviction")
            client.config_set("maxmemory", used + SMALL_MAXMEMORY // 2)
    try:
        yield Store(cluster.url, {"REDIS_CLUSTER": "true"}), masters
    finally:
        for master in masters:
            with redis.Redis.from_url(master.url) as client:
                client.config_set("maxmemory", 0)


def _refused_writes(masters: list[RedisServer]) -> list[int]:
    """How many commands each master refused for memory since it started (its `errorstat_OOM`)."""
    counts = []
    for master in masters:
        with redis.Redis.from_url(master.url) as client:
            counts.append(int(client.info("errorstats").get("errorstat_OOM", {}).get("count", 0)))
    return counts


def _create(broker: BrokerProcess) -> tuple[int, Any, dict[str, str]]:
    return broker.exchange("POST", "/v1/runs", BODY, timeout=30)


def _ended(broker: BrokerProcess, accepted: list[str], timeout: float) -> collections.Counter[str]:
    """How the accepted jobs ended, once every one did (within `timeout` s)."""
    pending = accepted

    def all_ended() -> bool:
        nonlocal pending
        pending = _unfinished(broker, pending)
        return not pending

    until(all_ended, timeout, "every accepted job ended")
    return collections.Counter(broker.request("GET", f"/v1/runs/{job_id}")[1]["status"] for job_id in accepted)


def _unfinished(broker: BrokerProcess, job_ids: list[str]) -> list[str]:
    return [job_id for job_id in job_ids if broker.request("GET", f"/v1/runs/{job_id}")[1]["status"] not in TERMINAL]


def test_a_flood_into_a_small_redis_ends_in_202s_and_503s_and_every_accepted_job_ends(
    start_broker: BrokerFactory, small_store: tuple[Store, list[RedisServer]], simulator: SimulatorProcess
) -> None:
    # Given a broker driving jobs against an uncapped Hermes, on a Redis of a few MB under noeviction
    store, masters = small_store
    refused_before = _refused_writes(masters)
    broker = start_broker(redis_url=store.url, HERMES_URL=simulator.url, CONSOLE_ENABLED="false", **store.variables)
    # When many clients create jobs of a few KB at once, more than the Redis can hold
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(lambda _: _create(broker), range(CREATES)))
    # Then every answer is a 202 or a 503 unavailable with Retry-After, never a 500, and both happened
    statuses = collections.Counter(status for status, _, _ in answers)
    assert set(statuses) == {202, 503}, statuses
    refused = [(body, headers) for status, body, headers in answers if status == 503]
    assert all(body["error"]["code"] == "unavailable" and int(headers["Retry-After"]) >= 1 for body, headers in refused)
    # And every accepted job reaches its end, completed
    accepted = [body["run_id"] for status, body, _ in answers if status == 202]
    assert _ended(broker, accepted, 180) == {"completed": len(accepted)}
    # And Redis never had to refuse a write: the broker stopped taking jobs first
    assert _refused_writes(masters) == refused_before
    errors = [line for line in broker.log_path.read_text().splitlines() if '"level":"ERROR"' in line]
    assert errors == []


QUOTAS = '{"default": {"live": 3, "waiting": 60}, "keys": {"big": {"live": 6, "waiting": 200}}}'
KEYS = ("big", "small-1", "small-2", "small-3")


def _create_keyed(broker: BrokerProcess, n: int) -> tuple[int, Any, dict[str, str]]:
    body = {**BODY, "scheduling": {"fairness_key": KEYS[n % len(KEYS)]}}
    return broker.exchange("POST", "/v1/runs", body, timeout=30)


def test_quotas_under_a_flood_into_a_small_redis_refuse_with_429_or_503_and_every_accepted_job_ends(
    start_broker: BrokerFactory, small_store: tuple[Store, list[RedisServer]], simulator: SimulatorProcess
) -> None:
    # Given a broker with live and waiting quotas per key, on a Redis of a few MB under noeviction
    store, masters = small_store
    refused_before = _refused_writes(masters)
    broker = start_broker(
        redis_url=store.url,
        HERMES_URL=simulator.url,
        CONSOLE_ENABLED="false",
        ADMISSION_QUOTAS=QUOTAS,
        **store.variables,
    )
    # When many clients flood four keys with jobs of a few KB, more than the quotas and the Redis allow
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(lambda n: _create_keyed(broker, n), range(CREATES)))
    # Then every answer is a 202, a 429 queue_full or a 503 unavailable, each refusal with Retry-After, never a 500
    statuses = collections.Counter(status for status, _, _ in answers)
    assert set(statuses) <= {202, 429, 503} and statuses[202] and statuses[429], statuses
    codes = {429: "queue_full", 503: "unavailable"}
    refused = [(status, body, headers) for status, body, headers in answers if status != 202]
    assert all(
        body["error"]["code"] == codes[status] and int(headers["Retry-After"]) >= 1 for status, body, headers in refused
    )
    # And every accepted job reaches its end, completed, and no key's live runs or held jobs are left counted
    accepted = [body["run_id"] for status, body, _ in answers if status == 202]
    assert _ended(broker, accepted, 240) == {"completed": len(accepted)}

    def quotas_empty() -> bool:
        shown = broker.request("GET", "/readyz")[1]["admission"]["quotas"]
        return all(entry["live"] == 0 and entry["held"] == 0 for entry in shown)

    until(quotas_empty, 30, "no live run or held job left counted")
    # And Redis never had to refuse a write, and nothing was logged as an error
    assert _refused_writes(masters) == refused_before
    errors = [line for line in broker.log_path.read_text().splitlines() if '"level":"ERROR"' in line]
    assert errors == []
