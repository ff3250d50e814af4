"""A replica frozen (SIGSTOP: its sockets stay open, nothing resets) while Hermes creates its job's run, for longer
than its run lease (SPEC S4 "One job, one thread, one Hermes run at a time"): another replica takes the job over and
runs it; the frozen one, thawed, reads Hermes's late answer to its create and must leave the job one run. A replica
SIGTERMed while its create is on its way waits for the answer and hands the job back with that run."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request

import pytest

from tests.conftest import RedisServer
from tests.e2e.conftest import BrokerFactory, BrokerProcess, SimulatorProcess, until
from tests.e2e.test_takeover import FAST
from tests.e2e.test_upstream_faults import control, create, creates, requests_of

#: Hermes answers the frozen replica's create this late (past its lease: the job is taken over meanwhile).
LATE_S = 5


def live_runs(sim: SimulatorProcess) -> int:
    with urllib.request.urlopen(f"{sim.url}/_sim/stats", timeout=5) as answer:
        return int(json.loads(answer.read())["live"])


def answered(sim: SimulatorProcess) -> bool:
    """Has Hermes answered the first create it got?"""
    first = next(r for r in requests_of(sim) if r["method"] == "POST" and r["path"] == "/v1/runs")
    return first["status"] is not None


@pytest.mark.parametrize("replays", [False, True], ids=["hermes-0.19", "upstream-main"])
def test_a_run_hermes_created_for_a_replica_frozen_past_its_lease_is_stopped_unless_it_is_the_jobs(
    start_broker: BrokerFactory, clean_redis: RedisServer, simulator: SimulatorProcess, replays: bool
) -> None:
    # Given a Hermes slow to answer creates, which ignores their Idempotency-Key (0.19: a second create of the job is
    # a second run) or replays the first run of a key (upstream main), and a replica whose create of a job's run is
    # on its way
    control(simulator, "settings", {"upstream_main": replays, "delay_s": LATE_S})
    env = {**FAST, "HERMES_URL": simulator.url, "RUNS_LEASE": "2000"}
    frozen = start_broker(redis_url=clean_redis.url, **env)
    job = create(frozen, "frozen owner sleep:30")
    until(lambda: creates(simulator) == [job], 15, "the create reached Hermes")
    control(simulator, "settings", {"delay_s": 0})
    assert frozen.process is not None
    # When that replica freezes past its lease, another takes the job over and Hermes runs it, and Hermes's answer
    # to the frozen replica's create waits in its socket until it thaws
    frozen.process.send_signal(signal.SIGSTOP)
    try:
        survivor = start_broker(redis_url=clean_redis.url, **env)
        running = until(lambda: running_view(survivor, job), 20, "the job taken over and running")
        until(lambda: answered(simulator), LATE_S + 5, "Hermes answered the frozen replica's create")
        assert live_runs(simulator) == (1 if replays else 2)
    finally:
        os.kill(frozen.process.pid, signal.SIGCONT)
    until(lambda: "Lost a job's run lease" in frozen.log_path.read_text(), 15, "the thawed replica let the job go")
    # Then the job keeps one run, the one its new owner follows: a second run is stopped, a replayed one left
    until(lambda: live_runs(simulator) == 1, 15, "one run live")
    deadline = time.monotonic() + 2  # the thawed replica's watch of its run polls every 200 ms
    while time.monotonic() < deadline:
        view = survivor.request("GET", f"/v1/runs/{job}")[1]
        assert view["status"] == "running" and view["hermes_run_id"] == running["hermes_run_id"], view
        assert live_runs(simulator) == 1
        time.sleep(0.2)
    with urllib.request.urlopen(f"{simulator.url}/v1/runs/{running['hermes_run_id']}", timeout=5) as answer:
        assert json.loads(answer.read())["status"] == "running"


def running_view(broker: BrokerProcess, job: str) -> dict[str, object] | None:
    view: dict[str, object] = broker.request("GET", f"/v1/runs/{job}")[1]
    return view if view.get("status") == "running" else None


def test_a_replica_sigtermed_while_hermes_creates_its_jobs_run_hands_the_job_back_with_that_run(
    start_broker: BrokerFactory, clean_redis: RedisServer, simulator: SimulatorProcess
) -> None:
    # Given a Hermes that ignores the Idempotency-Key (0.19), slow to answer a replica's create of a job's run
    control(simulator, "settings", {"delay_s": 2})
    env = {**FAST, "HERMES_URL": simulator.url, "SHUTDOWN_GRACE": "10000"}  # a drain waits up to half of it
    leaving = start_broker(redis_url=clean_redis.url, **env)
    job = create(leaving, "drained owner sleep:30")
    until(lambda: creates(simulator) == [job], 15, "the create reached Hermes")
    control(simulator, "settings", {"delay_s": 0})
    # When the replica is SIGTERMed (a rollout) before Hermes answers, and another replica runs
    assert leaving.terminate() == 0
    survivor = start_broker(redis_url=clean_redis.url, **env)
    # Then the drain waited for the answer and recorded the run, the new owner follows it, and it is the only one
    running = until(lambda: running_view(survivor, job), 20, "the job taken over and running")
    assert live_runs(simulator) == 1
    assert creates(simulator) == [job]
    with urllib.request.urlopen(f"{simulator.url}/v1/runs/{running['hermes_run_id']}", timeout=5) as answer:
        assert json.loads(answer.read())["status"] == "running"
