"""A Redis Cluster master SIGKILLed under load (SPEC S9): with REDIS_WAIT_REPLICAS=1 its replica is promoted,
the brokers carry on without a restart, and every job acknowledged with 202 is there and ends.

With one replica per master, the promoted master has no replica until the failed node is back: until then
writes of its slots cannot be confirmed by WAIT 1 (creates there answer 503, driver transitions retry). The
test brings the node back, as an operator (or an orchestrator) would."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from broker.store import keys
from tests.conftest import LocalCluster, RedisServer
from tests.e2e.conftest import BrokerFactory, BrokerProcess, SimulatorProcess, until

ENV = {
    "RUNS_POLL_INTERVAL": "200",
    "RUNS_BACKOFF": "50",
    "RUNS_BACKOFF_MAX": "200",
    "RUNS_LEASE": "1500",
    "REDIS_CLUSTER": "true",
    "REDIS_WAIT_REPLICAS": "1",
    "REDIS_WAIT_TIMEOUT": "2000",
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    """A cluster of this test's own: its topology changes."""
    directory = tmp_path / "cluster"
    directory.mkdir()
    own = LocalCluster(directory)
    try:
        own.start()
        yield own
    finally:
        own.stop()


class Creator(threading.Thread):
    """Creates jobs, round robin over the brokers, each with its own Idempotency-Key retried until a 202."""

    def __init__(self, brokers: list[BrokerProcess]) -> None:
        super().__init__(daemon=True)
        self.brokers = brokers
        self.acknowledged: list[str] = []
        self.refused = 0  #: answers other than 202 (503 not replicated, Redis unavailable) and errors
        self.wrong: list[tuple[int, object]] = []  #: answers that are neither 202 nor a 503 to retry (SPEC S9)
        self.stopping = threading.Event()

    def run(self) -> None:
        number = 0
        while not self.stopping.is_set():
            number += 1
            key = f"failover-{number}"
            while not self.stopping.is_set():
                broker = self.brokers[(number + self.refused) % len(self.brokers)]
                try:
                    status, body, headers = broker.exchange(
                        "POST",
                        "/v1/runs",
                        {"input": "slow sleep:1"},
                        timeout=10,
                        **{"Content-Type": "application/json", "Idempotency-Key": key},
                    )
                except OSError as error:
                    status, body, headers = 0, repr(error), {}
                if status == 202:
                    self.acknowledged.append(body["run_id"])
                    break
                self.refused += 1
                if not _retryable(status, body, headers):
                    self.wrong.append((status, body))
                time.sleep(0.05)


def _retryable(status: int, body: object, headers: dict[str, str]) -> bool:
    """A 503 `unavailable` in the envelope with a Retry-After: what a failover answers (SPEC S9)."""
    error = body.get("error") if isinstance(body, dict) else None
    return status == 503 and isinstance(error, dict) and error.get("code") == "unavailable" and "Retry-After" in headers


def error_lines(brokers: list[BrokerProcess]) -> list[str]:
    """Log lines at error level (a 500's "Failed to answer a request.", a runner's traceback): a failover is
    expected and logs warn lines only (SPEC S9)."""
    found = []
    for broker in brokers:
        for line in broker.log_path.read_text().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                found.append(line)  # a traceback printed outside the JSON log
                continue
            if record.get("level") == "error" or "exc_info" in record:
                found.append(line)
    return found


def replica_of(cluster: LocalCluster, master: RedisServer) -> RedisServer:
    client = redis.Redis(port=master.port, decode_responses=True)
    try:
        port = int(client.info("replication")["slave0"]["port"])
    finally:
        client.close()
    return next(node for node in cluster.nodes if node.port == port)


def cluster_down(node: RedisServer) -> bool:
    client = redis.Redis(port=node.port, decode_responses=True)
    try:
        return "cluster_state:fail" in str(client.execute_command("CLUSTER", "INFO"))
    finally:
        client.close()


def jobs_per_master(cluster: LocalCluster) -> dict[int, int]:
    counts = {}
    for node in cluster.masters():
        client = redis.Redis(port=node.port)
        counts[node.port] = sum(1 for _ in client.scan_iter(match=keys.EVENTS_MATCH, count=1000))
        client.close()
    return counts


@pytest.mark.timeout(300)
def test_a_killed_master_loses_no_acknowledged_job(
    start_broker: BrokerFactory, cluster: LocalCluster, simulator: SimulatorProcess
) -> None:
    # Given two brokers on a three-master cluster, acknowledging creates only once a replica has them
    brokers = [start_broker(redis_url=cluster.url, HERMES_URL=simulator.url, **ENV) for _ in range(2)]
    creator = Creator(brokers)
    creator.start()
    until(lambda: len(creator.acknowledged) >= 30, 60)
    # and jobs on every master
    spread = jobs_per_master(cluster)
    assert len(spread) == LocalCluster.MASTERS and all(count > 0 for count in spread.values()), spread
    # When a master is SIGKILLed under load
    victim = cluster.masters()[0]
    victim.stop(kill=True)
    before = len(creator.acknowledged)
    # Then its replica is promoted (writes of that shard wait for a replica meanwhile: 503 / retried)
    until(lambda: len(cluster.masters()) == LocalCluster.MASTERS, 30)
    victim.start()  # the failed node comes back, as the new master's replica
    # and creates are acknowledged again, without a broker restart
    until(lambda: len(creator.acknowledged) >= before + 30, 90)
    creator.stopping.set()
    creator.join(timeout=20)
    cluster.wait_ok(timeout=30)
    assert len(cluster.masters()) == LocalCluster.MASTERS
    assert all(broker.process is not None and broker.process.poll() is None for broker in brokers)
    # And every acknowledged job is there and ends
    acknowledged = list(dict.fromkeys(creator.acknowledged))

    def unfinished() -> list[str]:
        left = []
        for job_id in acknowledged:
            status, body = brokers[0].request("GET", f"/v1/runs/{job_id}")
            assert status == 200, (job_id, status, body)  # never lost
            if body["status"] != "completed":
                left.append(job_id)
        return left

    until(lambda: not unfinished(), 120)
    assert sum(jobs_per_master(cluster).values()) >= len(acknowledged)
    # And every refusal was a 503 to retry, logged as a warning, never a 500 or a traceback
    assert creator.wrong == []
    assert error_lines(brokers) == []


@pytest.mark.timeout(300)
def test_a_master_down_without_a_replica_answers_503_never_500(
    start_broker: BrokerFactory, cluster: LocalCluster, simulator: SimulatorProcess
) -> None:
    # Given two brokers on a three-master cluster and creates flowing
    brokers = [start_broker(redis_url=cluster.url, HERMES_URL=simulator.url, **ENV) for _ in range(2)]
    creator = Creator(brokers)
    creator.start()
    until(lambda: len(creator.acknowledged) >= 15, 60)
    # When a master's replica is cut off first, then the master is SIGKILLed: its slots have no one to fail over
    # to, and the cluster reports CLUSTERDOWN
    victim = cluster.masters()[0]
    spare = replica_of(cluster, victim)
    spare.stop(kill=True)
    victim.stop(kill=True)
    witness = next(node for node in cluster.masters() if node is not victim)
    until(lambda: cluster_down(witness), 30)
    refused = creator.refused
    until(lambda: creator.refused >= refused + 20, 60)  # creates keep coming while it is down
    # and the nodes come back (AOF: nothing acknowledged is lost)
    victim.start()
    spare.start()
    cluster.wait_ok(timeout=60)
    before = len(creator.acknowledged)
    until(lambda: len(creator.acknowledged) >= before + 15, 90)
    creator.stopping.set()
    creator.join(timeout=20)
    # Then every create answered 202 or a 503 `unavailable` with Retry-After, and the logs hold no error
    assert creator.wrong == []
    assert error_lines(brokers) == []
    # And every acknowledged job is there and ends
    acknowledged = list(dict.fromkeys(creator.acknowledged))

    def unfinished() -> list[str]:
        return [
            job_id
            for job_id in acknowledged
            if brokers[1].request("GET", f"/v1/runs/{job_id}")[1]["status"] != "completed"
        ]

    until(lambda: not unfinished(), 120)
