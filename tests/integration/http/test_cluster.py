"""The HTTP surface on a Redis Cluster and with REDIS_WAIT_REPLICAS (SPEC S9): /readyz shows the cluster, a
create is answered 202 only once replicated, else 503 `unavailable`, and a retry with its key replays it."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.conftest import ClientFactory

ON_CLUSTER = pytest.mark.parametrize("backend", ["cluster"], indirect=True)
KEYED = {"Idempotency-Key": "wait-1"}


@ON_CLUSTER
async def test_readyz_reports_the_cluster(make_client: ClientFactory) -> None:
    client = await make_client()
    answer = await client.get("/readyz")
    report: dict[str, Any] = await answer.json()
    assert answer.status == 200, report
    assert report["cluster"]["state"] == "ok" and report["cluster"]["slots_ok"] == 16384
    assert len(report["cluster"]["masters"]) == 3


@ON_CLUSTER
async def test_a_create_is_acknowledged_once_its_replica_has_it(make_client: ClientFactory) -> None:
    client = await make_client(redis_wait_replicas=1, redis_wait_timeout_ms=5_000)
    answer = await client.post("/v1/runs", json={"input": "x"}, headers=KEYED)
    assert answer.status == 202, await answer.text()


@pytest.mark.parametrize("backend", ["single", "cluster"], indirect=True)
async def test_a_create_not_replicated_in_time_is_503_and_a_retry_replays_it(make_client: ClientFactory) -> None:
    # Given more replicas asked for than exist (the single Redis has none; each master has one)
    impatient = await make_client(redis_wait_replicas=2, redis_wait_timeout_ms=100)
    answer = await impatient.post("/v1/runs", json={"input": "x"}, headers=KEYED)
    body = await answer.json()
    assert answer.status == 503, body
    assert body["error"]["code"] == "unavailable" and "not replicated in time" in body["error"]["message"]
    # When the client retries with its key where the wait can be met (or is not asked for)
    patient = await make_client(redis_wait_replicas=0)
    again = await patient.post("/v1/runs", json={"input": "x"}, headers=KEYED)
    # Then it is the same job, replayed
    replayed = await again.json()
    assert again.status == 202 and replayed["replayed"] is True
