"""Several Hermes deployments (SPEC S10) across broker processes: a broker given a list of upstreams starts,
serves and drives its jobs; the keys of the list never reach its output; a replica of the broker before S10
beside a new one (a rolling upgrade) shares one admission limit with it. Both backends."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import free_port
from tests.e2e.conftest import BrokerFactory, SimulatorProcess, Store, older_broker, until
from tests.e2e.test_takeover import FAST, create_jobs, statuses

#: main before S10 (the fair line, packed events and tracing merged): one Hermes, admission in `{adm}`.
MAIN_BEFORE_UPSTREAMS = "5b24291"


@pytest.fixture(scope="module")
def old_broker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return older_broker(MAIN_BEFORE_UPSTREAMS, tmp_path_factory.mktemp("before-upstreams"))


def stats(sim: SimulatorProcess) -> dict[str, object]:
    with urllib.request.urlopen(f"{sim.url}/_sim/stats", timeout=5) as answer:
        return dict(json.loads(answer.read()))


@pytest.fixture
def keyed_simulator() -> Iterator[SimulatorProcess]:
    sim = SimulatorProcess(free_port(), max_concurrent=10, api_key="first-secret-key")
    yield sim
    sim.process.terminate()
    sim.process.wait(timeout=10)


def test_a_list_of_upstreams_starts_and_drives_jobs_without_printing_its_keys(
    start_broker: BrokerFactory, clean_store: Store, keyed_simulator: SimulatorProcess
) -> None:
    simulator = keyed_simulator
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


def test_an_older_replica_beside_a_new_one_shares_one_limit_on_the_same_upstream(
    start_broker: BrokerFactory, clean_store: Store, simulator: SimulatorProcess, old_broker: Path
) -> None:
    # Given a replica of the broker before S10 and a new one, one HERMES_URL, a pinned limit of 2
    env = {**FAST, "HERMES_URL": simulator.url, "HERMES_MAX_CONCURRENT": "2"}
    old = start_broker(redis_url=clean_store.url, cwd=old_broker, **clean_store.variables, **env)
    new = start_broker(redis_url=clean_store.url, **clean_store.variables, **env)
    # When both take jobs and drive them
    jobs = create_jobs(old, 4, "old sleep:0.3") + create_jobs(new, 4, "new sleep:0.3")
    until(lambda: all(s == "completed" for s in statuses(new, jobs)), 45)
    # Then every job ran once, and never more than 2 runs were live on Hermes: the two count the same slots
    assert sorted(simulator.creates()) == sorted(jobs)
    assert stats(simulator)["peak_live"] == 2
    # (a run's slot goes back just after its job's last write, by whichever replica drove it)
    ready = until(lambda: _idle(new.request("GET", "/readyz")[1]), 5, "every slot back")
    (only,) = ready["admission"]["upstreams"]
    assert only["name"] == simulator.url.removeprefix("http://") and (only["live"], only["limit"]) == (0, 2)


def _idle(ready: Any) -> Any:
    """The /readyz report once no upstream holds a slot (else None)."""
    return ready if all(upstream["live"] == 0 for upstream in ready["admission"]["upstreams"]) else None
