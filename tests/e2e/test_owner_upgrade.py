"""A rolling upgrade beside the replica of the previous main (SPEC S3.2 `owner`, S9 "a store written by an earlier
version keeps working"): lease tokens now name their replica, and an earlier replica shares the leases with this
one. Both drive jobs of one store; the jobs this one drives show it as owner, the earlier one's show none; after
this replica is SIGKILLed the earlier one takes its jobs over and finishes them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import RedisServer
from tests.e2e.conftest import BrokerFactory, SimulatorProcess, older_broker, until
from tests.e2e.test_takeover import FAST, create_jobs, replica_of, statuses

#: main before the owner field: bare lease tokens.
MAIN_BEFORE_OWNER = "9e6b94c"


@pytest.fixture(scope="module")
def previous_main(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return older_broker(MAIN_BEFORE_OWNER, tmp_path_factory.mktemp("before-owner"))


def test_an_earlier_replica_and_this_one_share_leases_and_only_this_one_is_named(
    start_broker: BrokerFactory, clean_redis: RedisServer, simulator: SimulatorProcess, previous_main: Path
) -> None:
    # Given a replica of the previous main and one of this version on one store, a short lease
    env = {**FAST, "HERMES_URL": simulator.url, "RUNS_LEASE": "1500"}
    old = start_broker(redis_url=clean_redis.url, cwd=previous_main, **env)
    new = start_broker(redis_url=clean_redis.url, **env)
    new_id = replica_of(new)
    # When both take jobs that run a while
    jobs = create_jobs(old, 3, "old sleep:4") + create_jobs(new, 3, "new sleep:4")
    until(lambda: all(s == "running" for s in statuses(new, jobs)), 20, "all running")
    # Then each job shows this replica as owner or none (an earlier replica's lease names nobody)
    owners = {job: new.request("GET", f"/v1/runs/{job}")[1]["owner"] for job in jobs}
    assert set(owners.values()) <= {new_id, None}, owners
    assert all(old.request("GET", f"/v1/runs/{job}")[0] == 200 for job in jobs)
    # When this replica is SIGKILLed, the earlier one takes its jobs over and every job completes once
    new.kill()
    until(lambda: all(s == "completed" for s in statuses(old, jobs)), 45, "all completed")
    assert sorted(simulator.creates()) == sorted(jobs)
