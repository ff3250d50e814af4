"""A conversation's turns (SPEC S4.3) across replica processes during a rolling upgrade: a replica of the broker
before S4.3 driving jobs beside a new one on the same store.

On a cluster, where a create still rings the `line` doorbell that older replicas read, the older replica's passes
reach the turns a new replica created while they wait in the line, and the known limit shows every time. On a single
Redis a create of this version rings no doorbell (the `line J` message rings the new replicas' passes), so an older
replica notices new turns only at its 2 s tick, by when the new replica has parked them: the limit shows only now and
then there, and the test runs on the cluster."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.conftest import LocalCluster
from tests.e2e.conftest import BrokerFactory, SimulatorProcess, Store, older_broker, until
from tests.e2e.test_conversations import create, ended, job, timeline
from tests.e2e.test_takeover import FAST

#: main just before S4.3 (conversations) landed
MAIN_BEFORE_CONVERSATIONS = "7429c40"


@pytest.fixture(scope="module")
def old_broker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return older_broker(MAIN_BEFORE_CONVERSATIONS, tmp_path_factory.mktemp("before-conversations"))


@pytest.fixture
def cluster_store(redis_cluster: LocalCluster) -> Store:
    redis_cluster.wait_ok()
    redis_cluster.flush()
    return Store(redis_cluster.url, {"REDIS_CLUSTER": "true"})


@pytest.mark.xfail(
    strict=True,
    reason="known limit of a rolling upgrade: a replica from before S4.3 grants waiting turns from the line without "
    "their session and rewrites views without multitask; turns are ordered once every replica runs this version",
)
def test_an_older_replica_beside_a_new_one_never_runs_two_turns_of_a_session_at_once(
    start_broker: BrokerFactory, cluster_store: Store, simulator: SimulatorProcess, old_broker: Path
) -> None:
    # Given a new replica that drives one job at a time, running a session's first turn
    env = {**FAST, "HERMES_URL": simulator.url, "RUNS_LEASE": "1500"}
    new = start_broker(redis_url=cluster_store.url, **cluster_store.variables, **env, RUNS_CONCURRENCY="1")
    turns = [create(new, "turn 0 sleep:6", "s-roll")[1]["run_id"]]
    until(lambda: job(new, turns[0])["status"] == "running", 30, "the first turn running")
    # and a replica of the broker before S4.3 beside it on the same store (a rolling upgrade), free to drive
    old = start_broker(redis_url=cluster_store.url, cwd=old_broker, **cluster_store.variables, **env)
    # When the new replica takes five more turns of the session (multitask enqueue, its default)
    turns += [create(new, f"turn {i} sleep:0.5", "s-roll")[1]["run_id"] for i in range(1, 6)]
    until(lambda: ended(new, turns), 60, "every turn ended")
    # Then each turn ran after the one before it had ended, whichever replica drove it
    assert {job(new, job_id)["status"] for job_id in turns} == {"completed"}
    times = [timeline(new, job_id) for job_id in turns]
    for (_, before_end), (after_start, _) in itertools.pairwise(times):
        assert after_start >= before_end, times
    # and each still shows the strategy it was created with (an older replica's writes keep what it cannot read)
    assert [job(new, job_id)["scheduling"]["multitask"] for job_id in turns] == ["enqueue"] * 6
    assert old.process is not None
