"""Quotas (SPEC S4.4) with broker processes, where a replica freezes: a key's live run keeps counting against its
quota until another replica takes the job over."""

from __future__ import annotations

import json
import signal
import time

import redis

from broker.store import keys
from tests.conftest import RedisServer
from tests.e2e.conftest import BrokerFactory, BrokerProcess, SimulatorProcess, until

FAST = {"RUNS_POLL_INTERVAL": "200", "RUNS_BACKOFF": "50", "RUNS_BACKOFF_MAX": "200"}


def create(broker: BrokerProcess, text: str, key: str) -> str:
    body_in = {"input": text, "scheduling": {"fairness_key": key}}
    status, body = broker.request("POST", "/v1/runs", body_in, **{"Content-Type": "application/json"})
    assert status == 202, body
    job_id: str = body["run_id"]
    return job_id


def status(broker: BrokerProcess, job_id: str) -> str:
    result: str = broker.request("GET", f"/v1/runs/{job_id}")[1]["status"]
    return result


def test_a_frozen_replicas_live_run_keeps_counting_against_its_keys_live_quota(
    start_broker: BrokerFactory, clean_redis: RedisServer, simulator: SimulatorProcess
) -> None:
    """A replica frozen (SIGSTOP) with a key's run live on Hermes: the run keeps counting against the key's `live` quota
    until another replica takes the job over and counts it again, so no second run of the key starts beside it."""
    env = {
        **FAST,
        "HERMES_URL": simulator.url,
        "RUNS_LEASE": "3000",
        "HERMES_MAX_CONCURRENT": "8",
        "ADMISSION_QUOTAS": json.dumps({"keys": {"a": {"live": 1}}}),
    }
    frozen = start_broker(redis_url=clean_redis.url, **env)
    first = create(frozen, "a 0 sleep:10", "a")
    until(lambda: status(frozen, first) == "running", 15, "a's first run live")
    survivor = start_broker(redis_url=clean_redis.url, **env)
    store = redis.Redis.from_url(clean_redis.url, decode_responses=True)
    assert frozen.process is not None
    # When the replica driving a's run is frozen, and a's next job arrives just after its live entry expired
    frozen.process.send_signal(signal.SIGSTOP)
    try:
        until(lambda: (store.zscore(keys.quota_live("a"), first) or 0) <= time.time() * 1000, 10, "entry expiry")
        second = create(survivor, "a 1 sleep:3", "a")
        both = False
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline and not both:
            both = status(survivor, second) == "running" and status(survivor, first) == "running"
            time.sleep(0.05)
        # Then the second never runs while the first is live on Hermes
        assert not both, "two runs of key a live at once under a live quota of 1"
    finally:
        frozen.process.send_signal(signal.SIGKILL)
        frozen.process.wait(timeout=10)
        store.close()
