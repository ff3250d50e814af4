"""Replicas as processes: a SIGKILLed owner's jobs are taken over, a SIGTERMed one hands them back at once,
and Hermes sees one create per attempt key (SPEC S4 leases, takeover, drain)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from broker.codec import Packed, read_entry
from broker.store import keys
from tests.conftest import RedisServer
from tests.e2e.conftest import BrokerFactory, BrokerProcess, SimulatorProcess, Store, until

FAST = {"RUNS_POLL_INTERVAL": "200", "RUNS_BACKOFF": "50", "RUNS_BACKOFF_MAX": "200"}


def create_jobs(broker: BrokerProcess, count: int, text: str) -> list[str]:
    jobs = []
    for _ in range(count):
        status, body = broker.request("POST", "/v1/runs", {"input": text}, **{"Content-Type": "application/json"})
        assert status == 202
        jobs.append(body["run_id"])
    return jobs


def statuses(broker: BrokerProcess, jobs: list[str]) -> list[str]:
    return [broker.request("GET", f"/v1/runs/{job}")[1]["status"] for job in jobs]


def test_a_killed_owners_jobs_are_finished_by_the_other_replica(
    start_broker: BrokerFactory, clean_store: Store, simulator: SimulatorProcess
) -> None:
    # Given two replicas with a short lease, driving jobs that take a while
    env = {**FAST, "HERMES_URL": simulator.url, "RUNS_LEASE": "1500"}
    doomed = start_broker(redis_url=clean_store.url, **clean_store.variables, **env)
    jobs = create_jobs(doomed, 6, "slow sleep:6")  # long enough to outlast the second start-up on a busy machine
    until(lambda: all(s == "running" for s in statuses(doomed, jobs)), 15)
    survivor = start_broker(redis_url=clean_store.url, **clean_store.variables, **env)
    # When the replica that drives them all is SIGKILLed mid-run
    doomed.kill()
    # Then every job completes on the other one, without a second Hermes run for any attempt
    until(lambda: all(s == "completed" for s in statuses(survivor, jobs)), 30)
    finished = [survivor.request("GET", f"/v1/runs/{job}")[1] for job in jobs]
    assert all(job["attempts"] == 1 for job in finished)
    assert sorted(simulator.creates()) == sorted(jobs)  # one create per attempt key
    assert survivor.log_path.read_text().count("Took over a job.") == len(jobs)


def test_a_terminated_replica_hands_its_jobs_over_before_the_lease_expires(
    start_broker: BrokerFactory, clean_store: Store, simulator: SimulatorProcess
) -> None:
    # Given two replicas with a lease far longer than the jobs
    env = {**FAST, "HERMES_URL": simulator.url, "RUNS_LEASE": "60000"}
    leaving = start_broker(redis_url=clean_store.url, **clean_store.variables, **env)
    jobs = create_jobs(leaving, 6, "slow sleep:2")
    until(lambda: all(s == "running" for s in statuses(leaving, jobs)), 15)
    staying = start_broker(redis_url=clean_store.url, **clean_store.variables, **env)
    # When one replica is SIGTERMed (a rollout)
    assert leaving.terminate() == 0
    # Then the other finishes every job well before a lease could have expired
    until(lambda: all(s == "completed" for s in statuses(staying, jobs)), 20)
    assert '"jobs":6' in next(line for line in leaving.log_path.read_text().splitlines() if "Handed jobs back" in line)
    assert staying.log_path.read_text().count("Took over a job.") == len(jobs)
    assert sorted(simulator.creates()) == sorted(jobs)


def test_jobs_driven_through_a_redis_restart_finish_with_every_event(
    start_broker: BrokerFactory, simulator: SimulatorProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Given a replica driving jobs on a Redis of its own (AOF, fsync always)
    server = RedisServer(tmp_path_factory.mktemp("restarted-redis"))
    server.start()
    try:
        broker = start_broker(redis_url=server.url, **FAST, HERMES_URL=simulator.url, RUNS_LEASE="3000")
        jobs = create_jobs(broker, 4, "slow sleep:3 tools:1")
        until(lambda: all(s == "running" for s in statuses(broker, jobs)), 15)
        before = {job: len(_events(server, job)) for job in jobs}
        # When Redis is killed mid-run and comes back on the same port and files
        server.stop(kill=True)
        server.start()
        # Then every job still finishes, and no event acknowledged before the crash is gone
        until(lambda: all(s == "completed" for s in statuses(broker, jobs)), 60)
        for job in jobs:
            events = _events(server, job)
            assert len(events) > before[job]
            assert events[0] == "JobCreated" and events[-1] == "JobFinished"
    finally:
        server.stop()


def _events(server: RedisServer, job_id: str) -> list[str]:
    client = redis.Redis.from_url(server.url, decode_responses=True)
    try:
        entries = client.xrange(keys.events(job_id))
        read = [read_entry(fields[keys.EVENT_FIELD], job_id) for _, fields in entries]  # type: ignore[index,union-attr]
        return ["HermesEventRecorded" if isinstance(item, Packed) else type(item).__name__ for item in read]
    finally:
        client.close()


def test_the_owner_is_the_driving_replica_and_after_a_takeover_the_new_one(
    start_broker: BrokerFactory, clean_redis: RedisServer, simulator: SimulatorProcess
) -> None:
    # Given a replica driving a job, its log lines naming it
    env = {**FAST, "HERMES_URL": simulator.url, "RUNS_LEASE": "1500"}
    doomed = start_broker(redis_url=clean_redis.url, **env)
    (job_id,) = create_jobs(doomed, 1, "slow sleep:6")
    until(lambda: statuses(doomed, [job_id]) == ["running"], 15)
    doomed_id = replica_of(doomed)
    assert doomed.request("GET", f"/v1/runs/{job_id}")[1]["owner"] == doomed_id
    survivor = start_broker(redis_url=clean_redis.url, **env)
    survivor_id = replica_of(survivor)
    assert survivor_id != doomed_id
    # When that replica is SIGKILLed
    doomed.kill()
    # Then the job shows the replica that took it over, the one whose log line says it did
    until(lambda: survivor.request("GET", f"/v1/runs/{job_id}")[1]["owner"] == survivor_id, 15, "the new owner")

    def took() -> list[str]:
        return [
            r["replica"] for r in _records(survivor) if r["message"] == "Took over a job." and r.get("job") == job_id
        ]

    assert until(took, 15, "the takeover logged") == [survivor_id]  # the line follows the lease it shows
    until(lambda: statuses(survivor, [job_id]) == ["completed"], 30)
    assert survivor.request("GET", f"/v1/runs/{job_id}")[1]["owner"] is None


def _records(broker: BrokerProcess) -> list[dict[str, Any]]:
    return [json.loads(line) for line in broker.log_path.read_text().splitlines() if line.startswith("{")]


def replica_of(broker: BrokerProcess) -> str:
    """The replica id every log line of the broker carries (one per process)."""
    ids = {record["replica"] for record in _records(broker)}
    assert len(ids) == 1, ids
    return str(ids.pop())
