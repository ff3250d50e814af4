"""Several Hermes deployments (SPEC S10) across broker processes: a broker given a list of upstreams starts,
serves and drives its jobs; the keys of the list never reach its output."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import free_port
from tests.e2e.conftest import BrokerFactory, SimulatorProcess, Store, until
from tests.e2e.test_takeover import FAST, create_jobs, statuses


@pytest.fixture
def simulator() -> Iterator[SimulatorProcess]:
    sim = SimulatorProcess(free_port(), max_concurrent=10, api_key="first-secret-key")
    yield sim
    sim.process.terminate()
    sim.process.wait(timeout=10)


def test_a_list_of_upstreams_starts_and_drives_jobs_without_printing_its_keys(
    start_broker: BrokerFactory, clean_store: Store, simulator: SimulatorProcess
) -> None:
    # Given a broker with two upstreams, a key and a limit each (the second upstream is not there)
    env = {
        **FAST,
        "HERMES_URL": f"{simulator.url},http://127.0.0.1:{free_port()}/agent",
        "HERMES_API_KEY": "first-secret-key,second-secret-key",
        "HERMES_MAX_CONCURRENT": "3,5",
    }
    broker = start_broker(redis_url=clean_store.url, **clean_store.variables, **env)
    # When jobs are created, they complete, each created once on Hermes (with the first upstream's own key)
    jobs = create_jobs(broker, 4, "hello")
    until(lambda: all(s == "completed" for s in statuses(broker, jobs)), 30)
    assert sorted(simulator.creates()) == sorted(jobs)
    # Then the broker named its upstreams and printed none of their keys
    log = broker.log_path.read_text()
    assert simulator.url.removeprefix("http://") in log and f"{env['HERMES_URL'].rpartition('//')[2]}" in log
    assert "secret-key" not in log
    assert broker.request("GET", "/readyz")[0] == 200
