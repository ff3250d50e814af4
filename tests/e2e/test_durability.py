"""Durability (SPEC S1, S2, S3.1): a 202 means the job is in Redis, whatever dies afterwards."""

from __future__ import annotations

import json
import time
import urllib.request
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


#: What a create stored and a restart must keep. The rest of the object moves on its own: `hold` is derived from
#: the shared admission line (a killed replica's slots show until their leases expire), and a replica may drive
#: the job meanwhile (status, attempts, updated_at).
STORED = ("object", "run_id", "created_at", "session_id", "model", "context", "reporting", "scheduling")


def _assert_same_job(polled: dict[str, Any], created: dict[str, Any]) -> None:
    assert {k: polled.get(k) for k in STORED} == {k: created.get(k) for k in STORED}
    assert polled["status"] in ("queued", "running"), polled


def _first_event(broker: BrokerProcess, job_id: str) -> tuple[str, str]:
    """The id and the `event` of the job's first SSE frame (the create's), read from its event stream."""
    request = urllib.request.Request(f"{broker.url}/v1/runs/{job_id}/events")
    with urllib.request.urlopen(request, timeout=10) as stream:
        frame: dict[str, str] = {}
        for raw in stream:
            line = raw.decode().rstrip("\n")
            if not line and "data" in frame:
                return frame["id"], json.loads(frame["data"])["event"]
            field, _, value = line.partition(": ")
            frame[field] = value
    raise AssertionError("the event stream ended before its first frame")


def test_a_job_survives_sigkill_of_the_broker(start_broker: BrokerFactory, redis_server: RedisServer) -> None:
    # Given a broker on the session Redis, and a job it answered 202 for
    first = start_broker(redis_url=redis_server.url)
    job = _create(first, "e2e-kill")
    created_event = _first_event(first, job["run_id"])
    # When the broker is killed at once, and another one starts
    first.kill()
    second = start_broker(redis_url=redis_server.url)
    # Then the job answers with what its create stored, its events are there with their ids, and its key replays it
    status, polled = _get(second, job["run_id"])
    assert status == 200
    _assert_same_job(polled, job)
    assert _first_event(second, job["run_id"]) == created_event == (created_event[0], "job.queued")
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
