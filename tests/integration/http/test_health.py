"""Operations routes (SPEC S3.8): liveness, readiness with its report, Prometheus metrics."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

from broker.events import HoldReason
from broker.http.appkeys import admission_key, draining_key


async def test_healthz_answers_while_the_process_serves(client: TestClient[Any, Any]) -> None:
    answer = await client.get("/healthz")
    assert answer.status == 200 and (await answer.json())["status"] == "ok"


async def test_readyz_reports_redis_the_queue_and_hermes(client: TestClient[Any, Any]) -> None:
    await client.post("/v1/runs", json={"input": "waiting"})
    answer = await client.get("/readyz")
    report = await answer.json()
    assert answer.status == 200
    assert report["redis"] is True and report["draining"] is False and report["status"] == "ready"
    assert report["queue_depth"] == 1 and report["scheduled_jobs"] == 1
    assert isinstance(report["oldest_queued_age_ms"], int) and report["oldest_queued_age_ms"] >= 0
    assert "hermes_answered" in report


async def test_readyz_is_503_while_draining_and_metrics_say_so(client: TestClient[Any, Any]) -> None:
    assert "hbr_ready 1.0" in await (await client.get("/metrics")).text()
    client.app[draining_key][0] = True  # type: ignore[index]
    answer = await client.get("/readyz")
    report = await answer.json()
    assert answer.status == 503 and report["reason"] == "draining" and report["status"] == "not_ready"
    assert "hbr_ready 0.0" in await (await client.get("/metrics")).text()


async def test_metrics_count_created_and_replayed_jobs(client: TestClient[Any, Any]) -> None:
    for _ in range(2):
        await client.post("/v1/runs", json={"input": "x"}, headers={"Idempotency-Key": "m-1"})
    answer = await client.get("/metrics")
    text = await answer.text()
    assert answer.status == 200 and answer.content_type == "text/plain"
    assert "hbr_jobs_created_total 1.0" in text
    assert "hbr_jobs_replayed_total 1.0" in text
    assert "hbr_queue_depth 1.0" in text


async def test_readyz_and_metrics_show_waiting_jobs_by_priority_and_the_busiest_keys(
    client: TestClient[Any, Any],
) -> None:
    # Given waiting jobs of three keys (one from the session key header) and two priorities
    for priority, key, weight in [(1, "a", 2), (3, "a", 2), (3, "b", 1), (3, "b", 1), (3, "b", 1)]:
        scheduling = {"priority": priority, "fairness_key": key, "fairness_weight": weight}
        assert (await client.post("/v1/runs", json={"input": "x", "scheduling": scheduling})).status == 202
    await client.post("/v1/runs", json={"input": "x"}, headers={"X-Hermes-Session-Key": "user-1"})
    # When /readyz and /metrics are read
    admission = (await (await client.get("/readyz")).json())["admission"]
    metrics = await (await client.get("/metrics")).text()
    # Then they count them per priority, and name the keys with most waiting jobs, with their weights
    assert admission["waiting_by_priority"] == {"1": 1, "2": 0, "3": 5, "4": 0, "5": 0}
    assert admission["waiting_ahead"] == 0 and admission["line"] == 6
    assert admission["top_keys"] == [
        {"key": "b", "waiting": 3, "weight": 1.0},
        {"key": "a", "waiting": 2, "weight": 2.0},
        {"key": "user-1", "waiting": 1, "weight": 1.0},
    ]
    assert 'hbr_admission_waiting{priority="1"} 1.0' in metrics
    assert 'hbr_admission_waiting{priority="3"} 5.0' in metrics


async def test_readyz_and_metrics_show_each_upstreams_admission(make_client: Any) -> None:
    # Given a broker of two upstreams (SPEC S10), the second pinned at 4 and refusing (draining)
    client = await make_client(
        hermes_url="http://127.0.0.1:9,http://u:p@127.0.0.1:10/agent", hermes_max_concurrent=(0, 4)
    )
    second = "127.0.0.1:10/agent"
    await client.app[admission_key].refused(  # type: ignore[index]
        "job_x",
        1_000,
        reason=HoldReason.DRAINING,
        detail="Draining.",
        retry_after_ms=None,
        jitter=0.0,
        place="1",
        upstream=second,
    )
    # When /readyz and /metrics are read
    answer = await client.get("/readyz")
    report = await answer.json()
    metrics = await (await client.get("/metrics")).text()
    # Then each upstream has its entry, in HERMES_URL order, named without credentials; readiness is unchanged
    assert answer.status == 200
    first, other = report["admission"]["upstreams"]
    assert first == {
        "name": "127.0.0.1:9", "condition": "up", "live": 0, "limit": 2, "learnt": True, "refusing": False,
        "reason": None, "detail": None, "retry_at": None, "lost": False, "unreachable_since": None,
    }  # fmt: skip
    assert other["name"] == second and (other["limit"], other["learnt"]) == (4, False)
    assert (other["refusing"], other["reason"], other["detail"]) == (True, "draining", "Draining.")
    assert other["condition"] == "refusing"
    assert isinstance(other["retry_at"], float) and other["lost"] is False
    assert report["admission"]["refusing"] is False  # the top-level fields are the first upstream's
    assert 'hbr_upstream_limit{upstream="127.0.0.1:10/agent"} 4.0' in metrics
    assert 'hbr_upstream_refusing{upstream="127.0.0.1:10/agent"} 1.0' in metrics
    assert 'hbr_upstream_limit_learnt{upstream="127.0.0.1:9"} 1.0' in metrics
    assert "u:p" not in metrics and "u:p" not in str(report)
