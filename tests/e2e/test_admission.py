"""Admission across replica processes (SPEC S4.1): a SIGKILLed replica's slots come back within RUNS_LEASE,
the limit holds across replicas, and Hermes sees one run per attempt key."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker.store import keys
from tests.conftest import free_port
from tests.e2e.conftest import BrokerFactory, SimulatorProcess, Store, until
from tests.e2e.test_takeover import FAST, create_jobs, statuses


@pytest.fixture
def capped_simulator() -> Iterator[SimulatorProcess]:
    sim = SimulatorProcess(free_port(), max_concurrent=10)
    yield sim
    sim.process.terminate()
    sim.process.wait(timeout=10)


def live_slots(store: Store) -> int:
    """Admission slots whose holder still renews them (expired ones are free)."""
    client = store.client()
    try:
        return int(client.zcount(keys.ADMISSION_LIVE, f"({int(time.time() * 1000)}", "+inf"))
    finally:
        client.close()


def test_a_killed_replicas_slots_come_back_and_its_jobs_finish_once(
    start_broker: BrokerFactory, clean_store: Store, capped_simulator: SimulatorProcess
) -> None:
    # Given a replica that holds both slots of a limit of 2, with two more jobs waiting in the line
    env = {**FAST, "HERMES_URL": capped_simulator.url, "RUNS_LEASE": "1500", "HERMES_MAX_CONCURRENT": "2"}
    doomed = start_broker(redis_url=clean_store.url, **clean_store.variables, **env)
    jobs = create_jobs(doomed, 4, "slow sleep:2")
    until(lambda: statuses(doomed, jobs).count("running") == 2, 15)
    assert live_slots(clean_store) == 2
    # When it is SIGKILLed, nobody renews its slots: within RUNS_LEASE they are free again
    doomed.kill()
    until(lambda: live_slots(clean_store) == 0, 1.5 + 1.0)
    # Then another replica takes the running jobs over (their runs still count against the limit),
    # runs the waiting ones after them, and every attempt key was created on Hermes exactly once
    survivor = start_broker(redis_url=clean_store.url, **clean_store.variables, **env)
    until(lambda: all(s == "completed" for s in statuses(survivor, jobs)), 30)
    assert sorted(capped_simulator.creates()) == sorted(jobs)
    assert survivor.log_path.read_text().count("Took over a job.") == 2
    # (a run's slot goes back just after its job's last write)
    _, ready = until(lambda: _idle(survivor.request("GET", "/readyz")), 5, "every slot back")
    assert ready["admission"]["live"] == 0 and ready["admission"]["line"] == 0


def _idle(answer: tuple[int, Any]) -> tuple[int, Any] | None:
    """The /readyz answer once no slot is held (else None)."""
    return answer if answer[1]["admission"]["live"] == 0 else None
