"""A store written by the broker before the partitioned layout (SPEC S9): the new broker refuses to start on
it with one line naming the migration, `python scripts/migrate_layout.py` moves it, and then every job of
the old broker, running or waiting in the line when it was SIGKILLed, is driven to the end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from broker.config import _VARIABLES
from broker.store import keys
from tests.conftest import RedisServer
from tests.e2e.conftest import ROOT, BrokerFactory, SimulatorProcess, older_broker, until
from tests.e2e.test_takeover import create_jobs, statuses

#: Commits of main with the layout before partitions (`hbr:{J}:*`, `hbr:work`, `hbr:due`, ...): the one this
#: branch started from, and the last one before the merge (it adds the listing indexes `hbr:runs*`).
LAYOUT_1_COMMITS = ("e674966", "f41c631")
FAST = {"RUNS_POLL_INTERVAL": "200", "RUNS_BACKOFF": "50", "RUNS_BACKOFF_MAX": "200", "RUNS_LEASE": "1500"}


@pytest.fixture(scope="module", params=LAYOUT_1_COMMITS)
def old_broker(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Main before partitions, checked out (broker/ and projections/ only) into a temp dir."""
    commit = str(request.param)
    return older_broker(commit, tmp_path_factory.mktemp(f"layout-1-{commit}"))


def _env(redis_url: str, **variables: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name not in _VARIABLES}
    env.update(REDIS_URL=redis_url, PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), **variables)
    return env


def test_an_old_store_is_refused_then_migrated_then_driven_to_the_end(
    start_broker: BrokerFactory, clean_redis: RedisServer, simulator: SimulatorProcess, old_broker: Path
) -> None:
    # Given the old broker, with two live runs allowed, driving two slow jobs and holding three in its line
    env = {**FAST, "HERMES_URL": simulator.url, "HERMES_MAX_CONCURRENT": "2"}
    old = start_broker(redis_url=clean_redis.url, cwd=old_broker, **env)
    jobs = create_jobs(old, 5, "slow sleep:2")
    status, replayable = old.request(
        "POST", "/v1/runs", {"input": "keyed"}, **{"Content-Type": "application/json", "Idempotency-Key": "old-1"}
    )
    assert status == 202
    jobs.append(replayable["run_id"])
    until(lambda: statuses(old, jobs).count("running") == 2, 15)
    # When it is SIGKILLed (leases, schedule, line and doorbells of layout 1 stay behind)
    old.kill()
    client = redis.Redis.from_url(clean_redis.url, decode_responses=True)
    assert client.exists(keys.Legacy.WORK, keys.Legacy.DUE, keys.Legacy.ADMISSION_LINE) == 3
    # Then the new broker refuses to start, naming the migration in one line
    refused = subprocess.run(
        [sys.executable, "-m", "broker"], env=_env(clean_redis.url, PORT="0"), cwd=ROOT, capture_output=True, timeout=60
    )
    assert refused.returncode == 2
    lines = refused.stderr.decode().strip().splitlines()
    assert "python scripts/migrate_layout.py" in lines[-1] and "before partitions" in lines[-1]
    # And the migration moves the store, once
    migrate = [sys.executable, "scripts/migrate_layout.py"]
    check = subprocess.run([*migrate, "--check"], env=_env(clean_redis.url), cwd=ROOT, capture_output=True, timeout=60)
    assert check.returncode == 1
    moved = subprocess.run(migrate, env=_env(clean_redis.url), cwd=ROOT, capture_output=True, timeout=60)
    assert moved.returncode == 0, moved.stderr.decode()
    assert b'"left":[]' in moved.stdout
    check = subprocess.run([*migrate, "--check"], env=_env(clean_redis.url), cwd=ROOT, capture_output=True, timeout=60)
    assert check.returncode == 0
    assert [key for key in client.scan_iter(match=keys.Legacy.JOB_MATCH)] == []
    # And the new broker drives every old job to the end: the running ones taken over, the line in order
    new = start_broker(redis_url=clean_redis.url, **env)
    until(lambda: all(s == "completed" for s in statuses(new, jobs)), 60)
    finished = [new.request("GET", f"/v1/runs/{job}")[1] for job in jobs]
    assert all(job["attempts"] == 1 for job in finished)
    assert sorted(simulator.creates()) == sorted(jobs)  # one Hermes create per attempt key, across both
    status, replayed = new.request(
        "POST", "/v1/runs", {"input": "keyed"}, **{"Content-Type": "application/json", "Idempotency-Key": "old-1"}
    )
    assert status == 200 or status == 202
    assert replayed["run_id"] == replayable["run_id"] and replayed["replayed"] is True
    client.close()
