"""Scripts configured like the broker (SPEC S7): with REDIS_URL unset they open the embedded Redis of DATA_DIR, the
running broker's when there is one, and never a second server on its files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import _VARIABLES
from tests.e2e.conftest import ROOT, BrokerFactory
from tests.e2e.test_startup import _redis_servers_of

pytestmark = pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads processes from /proc")


def _script(name: str, data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name not in _VARIABLES}
    env.update(DATA_DIR=str(data_dir), PYTHONPATH=str(ROOT))  # no REDIS_URL: the embedded Redis
    command = [sys.executable, str(ROOT / "scripts" / name), *args]
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def _summary(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert done.returncode == 0, done.stdout + done.stderr
    summary: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return summary


def test_scripts_use_the_running_brokers_embedded_redis_and_leave_it_running(
    start_broker: BrokerFactory, tmp_path: Path
) -> None:
    # Given a broker on its embedded Redis with a job
    data = tmp_path / "data"
    broker = start_broker(redis_url=None, data_dir=data)
    status, job = broker.request("POST", "/v1/runs", {"input": "hello"})
    assert status == 202
    servers = _redis_servers_of(data)
    assert len(servers) == 1
    # When the rebuild and the event-format scripts run with REDIS_URL unset on the same DATA_DIR
    rebuilt = _summary(_script("rebuild_projections.py", data))
    shown = _summary(_script("event_format.py", data))
    # Then they read the broker's store: the job is there, consistent
    assert (rebuilt["jobs"], rebuilt["differing"]) == (1, 0)
    assert shown["packed"] is True
    # And the broker's server is the only one there, still serving the broker
    assert _redis_servers_of(data) == servers
    assert broker.request("GET", f"/v1/runs/{job['run_id']}")[0] == 200


def test_without_a_broker_a_script_starts_the_embedded_redis_and_stops_it(
    start_broker: BrokerFactory, tmp_path: Path
) -> None:
    # Given the DATA_DIR of a broker that stopped after storing a job
    data = tmp_path / "data"
    broker = start_broker(redis_url=None, data_dir=data)
    assert broker.request("POST", "/v1/runs", {"input": "hello"})[0] == 202
    assert broker.terminate() == 0
    # When the rebuild script runs with REDIS_URL unset
    rebuilt = _summary(_script("rebuild_projections.py", data))
    # Then it read the stored job from the files, and left no server behind
    assert (rebuilt["jobs"], rebuilt["differing"]) == (1, 0)
    assert _redis_servers_of(data) == []
