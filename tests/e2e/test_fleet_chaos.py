"""Seeded chaos across a fleet (SPEC S10, S4): two broker replicas, three simulator processes, a real Redis (both
backends). While sessions' turns and keyed jobs arrive, the simulators suffer brief refusals, restarts that forget
every run, and a freeze (SIGSTOP) past the lost window followed by a thaw. Afterwards:
- nothing acknowledged is lost: every job completed;
- no attempt runs on two upstreams: an attempt key reached a second upstream only after the first was lost;
- affinity is kept while its upstream is up, and every move of a job or a session is marked by `job.rerouted`.

The seed comes from `CHAOS_SEED` (printed), so a failing schedule can be replayed."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator

import pytest

from tests.conftest import free_port
from tests.e2e.conftest import BrokerFactory, BrokerProcess, SimulatorProcess, Store, until
from tests.e2e.test_takeover import FAST
from tests.e2e.test_upstream_faults import control, name, requests_of

LOST_MS = 3_000
SESSIONS = [f"s-{n}" for n in range(6)]


@pytest.fixture
def three() -> Iterator[list[SimulatorProcess]]:
    sims = [SimulatorProcess(free_port()) for _ in range(3)]
    yield sims
    for sim in sims:
        os.kill(sim.process.pid, signal.SIGCONT)
        sim.process.terminate()
        sim.process.wait(timeout=10)


def events(broker: BrokerProcess, job_id: str) -> list[dict[str, object]]:
    """Every event of a finished job (its stream replays them all, then closes)."""
    found = []
    with urllib.request.urlopen(f"{broker.url}/v1/runs/{job_id}/events", timeout=20) as stream:
        for raw in stream:
            line = raw.decode().rstrip("\n")
            if line.startswith("data: "):
                found.append(json.loads(line[6:]))
    return found


class Chaos:
    """The seeded schedule: creates (sessions' turns one at a time, keyed jobs) and faults on the simulators."""

    def __init__(self, rng: random.Random, brokers: list[BrokerProcess], sims: list[SimulatorProcess]) -> None:
        self.rng, self.brokers, self.sims = rng, brokers, sims
        self.jobs: list[tuple[str, str | None]] = []  # (job, session) in create order
        self._last_turn: dict[str, str] = {}  # a session's latest job: its next turn waits until that one ended
        self._frozen: SimulatorProcess | None = None
        self._thaw_at = 0.0

    def run(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for _ in range(self.rng.randint(1, 3)):
                self._create()
            self._fault()
            time.sleep(self.rng.uniform(0.2, 0.6))
        if self._frozen is not None:
            os.kill(self._frozen.process.pid, signal.SIGCONT)

    def _create(self) -> None:
        session = self.rng.choice([*SESSIONS, None, None])
        turn = self._last_turn.get(session or "")
        if turn is not None and self.brokers[0].request("GET", f"/v1/runs/{turn}")[1]["status"] != "completed":
            session = None  # one turn of a session at a time: its next one goes where the last one ended
        body: dict[str, object] = {"input": f"turn sleep:{self.rng.choice([0.2, 0.5, 1])}"}
        if session is not None:
            body["session_id"] = session
        body["scheduling"] = {"fairness_key": self.rng.choice(["team-a", "team-b", "team-c"])}
        broker = self.rng.choice(self.brokers)
        status, answer = broker.request("POST", "/v1/runs", body, **{"Content-Type": "application/json"})
        assert status == 202, answer
        self.jobs.append((str(answer["run_id"]), session))
        if session is not None:
            self._last_turn[session] = str(answer["run_id"])

    def _fault(self) -> None:
        fault = self.rng.random()
        victim = self.rng.choice([sim for sim in self.sims if sim is not self._frozen])
        if fault < 0.15:
            control(victim, "refuse", {"seconds": self.rng.uniform(0.3, 1.5)})  # a brief fault
        elif fault < 0.22:
            control(victim, "restart", {})  # forgets every run: interrupted, resubmitted
        elif fault < 0.27 and self._frozen is None:
            self._frozen, self._thaw_at = victim, time.monotonic() + LOST_MS / 1000 + 2  # lost, then back
            os.kill(victim.process.pid, signal.SIGSTOP)
        if self._frozen is not None and time.monotonic() >= self._thaw_at:
            os.kill(self._frozen.process.pid, signal.SIGCONT)
            self._frozen = None


def created_on(sims: list[SimulatorProcess]) -> dict[str, set[str]]:
    """Attempt key -> the upstreams that received its create."""
    found: dict[str, set[str]] = defaultdict(set)
    for sim in sims:
        for request in requests_of(sim):
            if request["method"] == "POST" and request["path"] == "/v1/runs":
                found[str(request["idempotency_key"])].add(name(sim))
    return found


def test_a_fleet_under_seeded_chaos_loses_nothing_and_never_runs_an_attempt_twice(
    start_broker: BrokerFactory, clean_store: Store, three: list[SimulatorProcess]
) -> None:
    seed = int(os.environ.get("CHAOS_SEED", "7"))
    print(f"CHAOS_SEED={seed}")
    env = {
        **FAST,
        "HERMES_URL": ",".join(sim.url for sim in three),
        "HERMES_UPSTREAM_LOST": str(LOST_MS),
        "HERMES_AFFINITY_GRACE": "2000",
        "RUNS_RESUBMIT": "20",
        "RUNS_LEASE": "3000",
    }
    brokers = [start_broker(redis_url=clean_store.url, **clean_store.variables, **env) for _ in range(2)]
    chaos = Chaos(random.Random(seed), brokers, three)
    chaos.run(20)
    reader = brokers[0]

    def done() -> bool:
        return all(reader.request("GET", f"/v1/runs/{j}")[1]["status"] == "completed" for j, _ in chaos.jobs)

    until(done, 120, "every job completed")  # nothing acknowledged is lost
    keys = created_on(three)
    last_upstream: dict[str, str] = {}
    for job_id, session in chaos.jobs:
        seen = events(reader, job_id)
        moves = [e for e in seen if e["event"] == "job.rerouted"]
        accepted = [str(e["upstream"]) for e in seen if e["event"] == "job.accepted"]
        # every change of upstream between a job's attempts is marked
        changes = sum(1 for before, after in itertools.pairwise(accepted) if before != after)
        assert len(moves) >= changes, (job_id, accepted, moves)
        # an attempt key reached a second upstream only when its first was lost (its create's answer lost there)
        for key in (k for k in keys if k.split("#")[0] == job_id and len(keys[k]) > 1):
            assert any(m["reason"] == "lost" for m in moves), (key, keys[key], moves)
        # a session's turns stay on the upstream its last turn ended on, unless a move says otherwise
        if session is not None and accepted:
            if session in last_upstream and accepted[0] != last_upstream[session]:
                assert moves, (job_id, session, last_upstream[session], accepted)
            last_upstream[session] = accepted[-1]
