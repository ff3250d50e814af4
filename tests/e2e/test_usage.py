"""Usage (SPEC S4.5) with replicas as processes: a run is counted once whichever replica records it, also when the
replica that drove it is SIGKILLed mid-backlog and the other takes its jobs over."""

from __future__ import annotations

from typing import Any

from broker.codec import Packed, read_entry
from broker.events import JobFinished, RunAccepted
from broker.store import keys
from tests.e2e.conftest import BrokerFactory, BrokerProcess, SimulatorProcess, Store, until

FAST = {"RUNS_POLL_INTERVAL": "200", "RUNS_BACKOFF": "50", "RUNS_BACKOFF_MAX": "200", "RUNS_LEASE": "1500"}
KEY = "team-k"


def create(broker: BrokerProcess, text: str) -> str:
    body = {"input": text, "scheduling": {"fairness_key": KEY}}
    status, created = broker.request("POST", "/v1/runs", body, **{"Content-Type": "application/json"})
    assert status == 202
    return str(created["run_id"])


def summed(broker: BrokerProcess) -> dict[str, Any]:
    status, body = broker.request("GET", f"/v1/usage?key={KEY}")
    assert status == 200
    total: dict[str, Any] = {}
    for bucket in body["data"]:
        for name, value in bucket.items():
            if name != "start":
                total[name] = total.get(name, 0) + value
    return total


def slot_seconds(store: Store, jobs: list[str]) -> float:
    """What the streams say the runs held Hermes for: acceptance to end, summed."""
    client = store.client()
    total_ms = 0
    try:
        for job_id in jobs:
            read = [read_entry(fields[keys.EVENT_FIELD], job_id) for _, fields in client.xrange(keys.events(job_id))]  # type: ignore[index,union-attr]
            events = [item for item in read if not isinstance(item, Packed)]
            accepted = [event.at_ms for event in events if isinstance(event, RunAccepted)]
            ended = [event.at_ms for event in events if isinstance(event, JobFinished)]
            assert len(accepted) == 1 and len(ended) == 1, job_id
            total_ms += ended[0] - accepted[0]
    finally:
        client.close()
    return total_ms / 1000


def test_runs_are_counted_once_across_replicas_and_a_takeover(
    start_broker: BrokerFactory, clean_store: Store, simulator: SimulatorProcess
) -> None:
    # Given two replicas sharing a backlog of one key's jobs, some already finished, some running
    env = {**FAST, "HERMES_URL": simulator.url, "HERMES_MAX_CONCURRENT": "4"}
    doomed = start_broker(redis_url=clean_store.url, **clean_store.variables, **env)
    survivor = start_broker(redis_url=clean_store.url, **clean_store.variables, **env)
    jobs = [create(doomed, "hello") for _ in range(4)]
    jobs += [create(doomed if n % 2 else survivor, "slow sleep:2") for n in range(8)]
    until(lambda: sum(_status(survivor, job) == "completed" for job in jobs) >= 4, 30, "the first runs")
    # When one replica is SIGKILLed mid-backlog
    doomed.kill()
    # Then every job completes on the other, each run once
    until(lambda: all(_status(survivor, job) == "completed" for job in jobs), 60, "every job")
    assert sorted(simulator.creates()) == sorted(jobs)
    # And the key's usage counts each run exactly once, with the slot time its stream records
    expected = {"runs_started": 12, "runs_completed": 12, "runs_failed": 0, "runs_cancelled": 0}
    until(lambda: {name: summed(survivor).get(name) for name in expected} == expected, 15, "the usage")
    total = summed(survivor)
    assert total["total_tokens"] == 12 * 18 and total["input_tokens"] == 12 * 11
    assert abs(total["hermes_seconds"] - slot_seconds(clean_store, jobs)) < 0.01


def _status(broker: BrokerProcess, job_id: str) -> str:
    return str(broker.request("GET", f"/v1/runs/{job_id}")[1]["status"])
