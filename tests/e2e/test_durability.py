"""Durability (SPEC S1, S2, S3.1): a 202 means the job is in Redis, whatever dies afterwards."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.conftest import RedisServer
from tests.e2e.conftest import BrokerFactory, BrokerProcess

BODY = {"input": "durable", "context": {"title": "Keep me"}, "reporting": {"post": False}}


def _until(probe: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        time.sleep(0.05)


def _create(broker: BrokerProcess, key: str | None = None) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Idempotency-Key"] = key
    status, job = broker.request("POST", "/v1/runs", BODY, **headers)
    assert status == 202, job
    assert job["replayed"] is False
    return dict(job)


def _get(broker: BrokerProcess, job_id: str) -> tuple[int, Any]:
    try:
        return broker.request("GET", f"/v1/runs/{job_id}", timeout=3)
    except OSError:
        return 0, None


def _assert_same_job(polled: dict[str, Any], created: dict[str, Any]) -> None:
    assert {k: v for k, v in created.items() if k != "replayed"} == polled


def test_a_job_survives_sigkill_of_the_broker(start_broker: BrokerFactory, redis_server: RedisServer) -> None:
    # Given a broker on the session Redis, and a job it answered 202 for
    first = start_broker(redis_url=redis_server.url)
    job = _create(first, "e2e-kill")
    # When the broker is killed at once, and another one starts
    first.kill()
    second = start_broker(redis_url=redis_server.url)
    # Then the job answers with the same body, and its key replays it
    status, polled = _get(second, job["run_id"])
    assert status == 200
    _assert_same_job(polled, job)
    status, again = second.request("POST", "/v1/runs", BODY, **{"Idempotency-Key": "e2e-kill"})
    assert (status, again["replayed"], again["run_id"]) == (202, True, job["run_id"])


def test_embedded_redis_keeps_jobs_across_a_graceful_restart(start_broker: BrokerFactory, tmp_path: Path) -> None:
    # Given a broker with embedded Redis (REDIS_URL unset) and a job
    data = tmp_path / "embedded"
    first = start_broker(redis_url=None, data_dir=data)
    job = _create(first)
    # When it stops on SIGTERM and starts again on the same DATA_DIR
    assert first.terminate() == 0
    assert (data / "appendonlydir").is_dir() or any(data.glob("*.aof"))
    second = start_broker(redis_url=None, data_dir=data)
    # Then the job is still there (append-only file)
    status, polled = _get(second, job["run_id"])
    assert status == 200
    _assert_same_job(polled, job)


def test_embedded_redis_keeps_jobs_across_sigkill_of_the_broker(start_broker: BrokerFactory, tmp_path: Path) -> None:
    # Given a broker with embedded Redis and a job it answered 202 for
    data = tmp_path / "embedded"
    first = start_broker(redis_url=None, data_dir=data)
    job = _create(first)
    # When the broker is killed (its redis-server is orphaned) and a new one starts on the same dir
    first.kill()
    second = start_broker(redis_url=None, data_dir=data)
    # Then the job is still there
    status, polled = _get(second, job["run_id"])
    assert status == 200
    _assert_same_job(polled, job)


def test_a_job_survives_a_redis_restart_and_the_broker_recovers(
    start_broker: BrokerFactory, tmp_path_factory: Any
) -> None:
    # Given a Redis of our own (AOF, fsync always) and a broker on it, and a job answered 202
    redis = RedisServer(tmp_path_factory.mktemp("own-redis"))
    redis.start()
    try:
        broker = start_broker(redis_url=redis.url)
        job = _create(broker, "e2e-redis")
        # When Redis is killed and restarted on the same dir and port
        redis.stop(kill=True)
        # Then while it is down the broker answers a retryable 503 in the envelope (after its retries)
        status, down = broker.request("GET", f"/v1/runs/{job['run_id']}", timeout=60)
        assert (status, down["error"]["code"], down["error"]["type"]) == (503, "unavailable", "server_error")
        redis.start()

        # And once it is back the broker answers the job again, with the same body
        def answers() -> bool:
            return _get(broker, job["run_id"])[0] == 200

        _until(answers)
        _assert_same_job(_get(broker, job["run_id"])[1], job)
        # And it keeps serving: a new create and a replay work
        _create(broker, "e2e-after")
        status, again = broker.request("POST", "/v1/runs", BODY, **{"Idempotency-Key": "e2e-redis"})
        assert (status, again["replayed"]) == (202, True)
        status, ready = broker.request("GET", "/readyz")
        assert status == 200, ready
    finally:
        redis.stop()
