"""A fleet in its bad moments (SPEC S10 "What counts as an answer", "A lost upstream takes no new work"): broker
processes, two simulator processes, a real Redis (both backends). Each fault is the quiet or brief kind that a
SIGKILL-and-restart test does not exercise: a refusal after an idle spell, an upstream never heard from, a frozen
host (SIGSTOP: its sockets stay open), a create whose answer was lost, and a refusal the fleet must get over."""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.conftest import free_port
from tests.e2e.conftest import BrokerFactory, BrokerProcess, SimulatorProcess, Store, until
from tests.e2e.test_takeover import FAST

#: A short lost window, so each fault plays out in seconds.
LOST_MS = 3_000


@pytest.fixture
def two() -> Iterator[tuple[SimulatorProcess, SimulatorProcess]]:
    sims = (SimulatorProcess(free_port()), SimulatorProcess(free_port()))
    yield sims
    for sim in sims:
        os.kill(sim.process.pid, signal.SIGCONT)  # a test may leave one stopped
        sim.process.terminate()
        sim.process.wait(timeout=10)


def name(sim: SimulatorProcess) -> str:
    return sim.url.removeprefix("http://")


def control(sim: SimulatorProcess, path: str, body: dict[str, object]) -> None:
    request = urllib.request.Request(
        f"{sim.url}/_sim/{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5):
        pass


def requests_of(sim: SimulatorProcess) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"{sim.url}/_sim/requests", timeout=5) as answer:
        return list(json.loads(answer.read())["requests"])


def creates(sim: SimulatorProcess) -> list[str]:
    return [str(r["idempotency_key"]) for r in requests_of(sim) if r["method"] == "POST" and r["path"] == "/v1/runs"]


def create(broker: BrokerProcess, text: str, **fields: object) -> str:
    status, body = broker.request("POST", "/v1/runs", {"input": text, **fields}, **{"Content-Type": "application/json"})
    assert status == 202, body
    return str(body["run_id"])


def job(broker: BrokerProcess, job_id: str) -> dict[str, object]:
    return dict(broker.request("GET", f"/v1/runs/{job_id}")[1])


def upstream_entry(broker: BrokerProcess, sim: SimulatorProcess) -> dict[str, object]:
    _, ready = broker.request("GET", "/readyz")
    return next(u for u in ready["admission"]["upstreams"] if u["name"] == name(sim))


def fleet(start_broker: BrokerFactory, store: Store, sims: tuple[SimulatorProcess, ...], **env: str) -> BrokerProcess:
    variables = {**FAST, "HERMES_URL": ",".join(s.url for s in sims), "HERMES_UPSTREAM_LOST": str(LOST_MS), **env}
    return start_broker(redis_url=store.url, **store.variables, **variables)


def test_one_refusal_after_an_idle_spell_neither_loses_the_upstream_nor_moves_its_session(
    start_broker: BrokerFactory, clean_store: Store, two: tuple[SimulatorProcess, SimulatorProcess]
) -> None:
    a, b = two
    broker = fleet(start_broker, clean_store, two, HERMES_AFFINITY_GRACE="20000")
    # Given a session whose first turn ran on one upstream, then a spell longer than the lost window without a call
    first = create(broker, "hello", session_id="s-idle")
    until(lambda: job(broker, first)["status"] == "completed", 30)
    home = a if job(broker, first)["upstream"] == name(a) else b
    time.sleep(LOST_MS / 1000 + 0.5)  # the idle spell itself is the condition under test
    # When that upstream drops every connection for 2 s and the session's next turn arrives meanwhile
    control(home, "refuse", {"seconds": 2})
    second = create(broker, "again", session_id="s-idle")
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:  # Then it is never reported lost during the refusal
        assert upstream_entry(broker, home)["lost"] is False
        time.sleep(0.1)
    # And the turn runs on its own upstream once it is back, without a move
    until(lambda: job(broker, second)["status"] == "completed", 30)
    assert job(broker, second)["upstream"] == name(home)
    assert second in creates(home)


def test_an_upstream_never_heard_from_is_found_lost_and_takes_no_work(
    start_broker: BrokerFactory, clean_store: Store, simulator: SimulatorProcess
) -> None:
    # Given a fleet whose second upstream has never answered since the broker started (nothing listens there)
    dead = f"http://127.0.0.1:{free_port()}"
    broker = start_broker(
        redis_url=clean_store.url,
        **clean_store.variables,
        **{**FAST, "HERMES_URL": f"{simulator.url},{dead}", "HERMES_UPSTREAM_LOST": str(LOST_MS)},
    )
    # When jobs arrive (one is offered to it: it refuses the connection)
    jobs = [create(broker, f"job {n}") for n in range(4)]
    # Then they all run on the first, and the dead one is reported unreachable, then lost within the window
    until(lambda: all(job(broker, j)["status"] == "completed" for j in jobs), 30)
    assert all(job(broker, j)["upstream"] == name(simulator) for j in jobs)

    def lost() -> bool:
        _, ready = broker.request("GET", "/readyz")
        entry = next(u for u in ready["admission"]["upstreams"] if u["name"] == dead.removeprefix("http://"))
        return bool(entry["lost"]) and entry["unreachable_since"] is not None

    until(lost, LOST_MS / 1000 + 10, "the dead upstream reported lost")
    assert broker.request("GET", "/readyz")[0] == 200  # one usable upstream keeps the broker ready


def test_a_frozen_upstreams_run_is_resubmitted_elsewhere_and_stopped_there_when_it_thaws(
    start_broker: BrokerFactory, clean_store: Store, two: tuple[SimulatorProcess, SimulatorProcess]
) -> None:
    a, b = two
    broker = fleet(start_broker, clean_store, two)
    # Given a long run streaming on one upstream
    long = create(broker, "long sleep:20")
    until(lambda: job(broker, long)["status"] == "running", 15)
    frozen = a if job(broker, long)["upstream"] == name(a) else b
    other = b if frozen is a else a
    first_run = str(job(broker, long)["hermes_run_id"])
    # When its host freezes (SIGSTOP: its sockets stay open, nothing answers, no stream closes)
    os.kill(frozen.process.pid, signal.SIGSTOP)
    # Then the run is found lost within the window (plus a poll) and resubmitted to the other upstream
    until(lambda: job(broker, long)["upstream"] == name(other), LOST_MS / 1000 + 15, "the run moved")
    assert job(broker, long)["attempts"] == 2
    assert upstream_entry(broker, frozen)["lost"] is True
    # And while it is lost it takes no new work
    fresh = [create(broker, f"fresh {n}") for n in range(3)]
    until(lambda: all(job(broker, j)["status"] == "completed" for j in fresh), 30)
    assert all(job(broker, j)["upstream"] == name(other) for j in fresh)
    # When it thaws, the run it still holds for the moved job is stopped there, and it takes work again
    os.kill(frozen.process.pid, signal.SIGCONT)
    stop_path = f"/v1/runs/{first_run}/stop"
    until(lambda: any(r["path"] == stop_path for r in requests_of(frozen)), 20, "the orphan stopped")
    assert not set(fresh) & set(creates(frozen))  # no create reached it while it was lost (none queued either)
    until(lambda: upstream_entry(broker, frozen)["lost"] is False, 10)
    later = [create(broker, f"later {n}") for n in range(6)]
    until(lambda: all(job(broker, j)["status"] == "completed" for j in later), 30)
    assert set(later) & set(creates(frozen)), "the thawed upstream takes work again"


def test_a_create_whose_answer_was_lost_runs_once_on_its_upstream(
    start_broker: BrokerFactory, clean_store: Store, two: tuple[SimulatorProcess, SimulatorProcess]
) -> None:
    a, b = two
    # Given the first upstream answers every call 1.5 s late, past the broker's 1 s timeout (the run comes alive)
    control(a, "settings", {"delay_s": 1.5})
    # (a lost window well past the slow spell: this is about a lost answer, not a lost upstream)
    broker = fleet(
        start_broker, clean_store, two, HERMES_TIMEOUT="1000", HERMES_MAX_CONCURRENT="1,4", HERMES_UPSTREAM_LOST="30000"
    )
    # When a job is offered to it (the first upstream's one slot is the lowest share) and its answer is lost
    target = create(broker, "sleep:1 only once")
    until(lambda: target in creates(a), 10, "the create reached the first upstream")
    time.sleep(2.5)  # while the answer is lost and the first upstream stays slow (a test of what does NOT happen)
    assert target not in creates(b), "a create whose answer was lost went to a second upstream"
    control(a, "settings", {"delay_s": 0.0})
    # Then once the upstream answers again the create is replayed there with its key, and the job runs once
    until(lambda: job(broker, target)["status"] == "completed", 30)
    assert job(broker, target)["upstream"] == name(a) and job(broker, target)["attempts"] == 1
    assert target not in creates(b)


def test_an_upstream_that_refused_briefly_is_tried_again_while_the_other_has_room(
    start_broker: BrokerFactory, clean_store: Store, two: tuple[SimulatorProcess, SimulatorProcess]
) -> None:
    a = two[0]
    broker = fleet(start_broker, clean_store, two, HERMES_UPSTREAM_LOST="60000", HERMES_MAX_CONCURRENT="10,10")
    # Given the first upstream drops its connections for 1 s while jobs arrive (they run on the second, which
    # keeps room for every job of this test)
    control(a, "refuse", {"seconds": 1})
    early = [create(broker, f"early {n}") for n in range(4)]
    until(lambda: all(job(broker, j)["status"] == "completed" for j in early), 30)
    time.sleep(1.2)  # the refusal is over (nothing to poll for: the refusal's end is a clock)
    # And the broker's health probe found the first answering again (a probe interval after the refusal's end)
    until(lambda: upstream_entry(broker, a)["unreachable_since"] is None, 15, "the first upstream found answering")
    # When more jobs arrive while the second upstream still has room
    later = [create(broker, f"later {n}") for n in range(8)]
    until(lambda: all(job(broker, j)["status"] == "completed" for j in later), 30)
    # Then the first upstream takes a share of them again
    assert len(set(later) & set(creates(a))) >= 2
