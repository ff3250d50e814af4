"""Reachability at a glance (SPEC S10, S3.8): a killed upstream reads unreachable within seconds in /readyz and
/metrics, never busy with the 429 it answered before; an upstream reads busy only while Hermes answers 429.
Broker process, two simulator processes (one killed), a real Redis."""

from __future__ import annotations

import os
import signal
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import RedisServer, free_port
from tests.e2e.conftest import BrokerFactory, BrokerProcess, SimulatorProcess, until
from tests.e2e.test_takeover import FAST, create_jobs, statuses

#: Long enough that the killed upstream is seen unreachable well before it is lost.
LOST_MS = 10_000
TOO_MANY = "Too many concurrent runs (max 1)"


@pytest.fixture
def capped() -> Iterator[tuple[SimulatorProcess, SimulatorProcess]]:
    """Two simulators that run one run at a time and answer 429 past it."""
    sims = (SimulatorProcess(free_port(), max_concurrent=1), SimulatorProcess(free_port(), max_concurrent=1))
    yield sims
    for sim in sims:
        if sim.process.poll() is None:
            sim.process.terminate()
            sim.process.wait(timeout=10)


def _name(sim: SimulatorProcess) -> str:
    return sim.url.removeprefix("http://")


def _entry(broker: BrokerProcess, sim: SimulatorProcess) -> dict[str, Any]:
    _, ready = broker.request("GET", "/readyz")
    return dict(next(u for u in ready["admission"]["upstreams"] if u["name"] == _name(sim)))


def _gauges(broker: BrokerProcess, sim: SimulatorProcess) -> dict[str, float]:
    """The upstream's hbr_upstream_* gauges from /metrics."""
    with_label = f'{{upstream="{_name(sim)}"}} '
    gauges = {}
    for line in _text(broker, "/metrics").splitlines():
        if line.startswith("hbr_upstream_") and with_label in line:
            name, _, value = line.partition(with_label)
            gauges[name.removeprefix("hbr_upstream_")] = float(value)
    return gauges


def _text(broker: BrokerProcess, path: str) -> str:
    with urllib.request.urlopen(f"{broker.url}{path}", timeout=5) as answer:
        return bytes(answer.read()).decode()


def test_a_killed_upstream_reads_unreachable_not_busy_and_busy_lasts_only_while_hermes_answers_429(
    start_broker: BrokerFactory, clean_redis: RedisServer, capped: tuple[SimulatorProcess, SimulatorProcess]
) -> None:
    a, b = capped
    # Given a broker that offers each upstream more runs than it takes (pinned at 3, Hermes runs one)
    env = {**FAST, "HERMES_URL": f"{a.url},{b.url}", "HERMES_MAX_CONCURRENT": "3", "HERMES_UPSTREAM_LOST": str(LOST_MS)}
    broker = start_broker(redis_url=clean_redis.url, **env)
    jobs = create_jobs(broker, 4, "slow sleep:3")
    # Then both read busy, with Hermes's own words, while Hermes answers 429
    for sim in (a, b):
        busy = until(lambda sim=sim: (e := _entry(broker, sim))["refusing"] and e, 15, "refusing")
        assert (busy["condition"], busy["reason"], busy["detail"]) == ("busy", "busy", TOO_MANY)
        assert busy["unreachable_since"] is None
        until(lambda sim=sim: _gauges(broker, sim)["busy"] == 1, 5, "the busy gauge")
    # When one upstream is killed
    os.kill(b.process.pid, signal.SIGKILL)
    b.process.wait(timeout=10)
    # Then within seconds it reads unreachable, with when that began and its own detail, and not busy
    gone = until(lambda: (e := _entry(broker, b))["condition"] == "unreachable" and e, 5, "unreachable")
    assert (gone["refusing"], gone["reason"], gone["lost"]) == (True, "unavailable", False)
    assert isinstance(gone["unreachable_since"], float) and TOO_MANY not in gone["detail"]
    assert _name(b) in gone["detail"]
    gauges = _gauges(broker, b)
    assert (gauges["unreachable"], gauges["busy"], gauges["lost"]) == (1, 0, 0)
    _, ready = broker.request("GET", "/readyz")
    assert ready["hermes_answered"] is False and ready["status"] == "ready"  # the other upstream is usable
    console = _text(broker, "/console")  # the upstreams side by side
    assert 'data-upstream-condition="unreachable"' in console
    # And it is lost once the window passed, still not busy
    until(lambda: _entry(broker, b)["condition"] == "lost", LOST_MS / 1000 + 10, "lost")
    assert _gauges(broker, b)["busy"] == 0
    # And every job ends on the other one, which reads busy no more once Hermes stopped answering 429
    until(lambda: all(s == "completed" for s in statuses(broker, jobs)), 60, "all completed")
    after = until(lambda: (e := _entry(broker, a))["condition"] == "up" and e, 10, "up")
    assert (after["refusing"], after["reason"], after["detail"]) == (False, None, None)
    assert _gauges(broker, a)["busy"] == 0


def test_a_lone_upstream_killed_after_a_429_reads_unreachable_not_busy(
    start_broker: BrokerFactory, clean_redis: RedisServer
) -> None:
    # Given a lone upstream that runs one run and answered 429 to a second, held job that was then stopped, and two
    # replicas
    sim = SimulatorProcess(free_port(), max_concurrent=1)
    try:
        env = {**FAST, "HERMES_URL": sim.url, "HERMES_MAX_CONCURRENT": "3"}
        broker = start_broker(redis_url=clean_redis.url, **env)
        other = start_broker(redis_url=clean_redis.url, **env)
        running, held = create_jobs(broker, 2, "slow sleep:60")
        until(lambda: _entry(broker, sim)["reason"] == "busy", 15, "busy")
        broker.request("POST", f"/v1/runs/{held}/stop")
        until(lambda: statuses(broker, [held]) == ["cancelled"], 10, "the held job cancelled")
        # When the upstream is killed (nothing is left to probe it with a create)
        os.kill(sim.process.pid, signal.SIGKILL)
        sim.process.wait(timeout=10)
        # Then within seconds it reads unreachable, never lost, and no longer Hermes's old 429
        gone = until(lambda: (e := _entry(broker, sim))["condition"] == "unreachable" and e, 15, "unreachable")
        assert (gone["reason"], gone["lost"]) == ("unavailable", False)
        assert isinstance(gone["unreachable_since"], float) and TOO_MANY not in gone["detail"]
        gauges = _gauges(broker, sim)
        assert (gauges["unreachable"], gauges["busy"], gauges["lost"]) == (1, 0, 0)
        for replica in (broker, other):  # every replica says so, whichever one's calls failed
            _, ready = replica.request("GET", "/readyz")
            assert ready["hermes_answered"] is False and ready["admission"]["detail"] == gone["detail"]
            assert ready["status"] == "ready"  # the broker takes jobs (they wait): /readyz does not hang on Hermes
        assert statuses(broker, [running]) == ["running"]  # its run may be live: it is polled, not moved
    finally:
        if sim.process.poll() is None:
            sim.process.kill()
            sim.process.wait()


def test_an_idle_upstream_that_dies_or_freezes_reads_unreachable_without_a_job_going_there(
    start_broker: BrokerFactory, clean_redis: RedisServer
) -> None:
    a, b = SimulatorProcess(free_port()), SimulatorProcess(free_port())
    try:
        # Given two upstreams that answered and now have nothing to do
        env = {**FAST, "HERMES_URL": f"{a.url},{b.url}", "HERMES_UPSTREAM_LOST": str(LOST_MS)}
        broker = start_broker(redis_url=clean_redis.url, **env)
        jobs = create_jobs(broker, 2, "quick")
        until(lambda: statuses(broker, jobs) == ["completed"] * 2, 20, "both completed")
        # When one is killed and the other frozen (its socket open, never answering)
        os.kill(b.process.pid, signal.SIGKILL)
        os.kill(a.process.pid, signal.SIGSTOP)
        # Then neither reads up, though no job went to either: the dead one is unreachable within seconds, the frozen
        # one once a probe timed out (a call waits at most the lost window: it is unreachable, then at once lost)
        until(lambda: _entry(broker, b)["condition"] == "unreachable", 15, "the killed one unreachable")
        down = ("unreachable", "lost")
        until(lambda: _entry(broker, a)["condition"] in down, LOST_MS / 1000 + 15, "the frozen one not up")
        # And the frozen one reads up again once it thaws
        os.kill(a.process.pid, signal.SIGCONT)
        until(lambda: _entry(broker, a)["condition"] == "up", 15, "up again")
    finally:
        for sim in (a, b):
            if sim.process.poll() is None:
                os.kill(sim.process.pid, signal.SIGCONT)
                sim.process.kill()
                sim.process.wait()
