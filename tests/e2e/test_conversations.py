"""A conversation's turns across replica processes (SPEC S4.3): one live turn per session, in create order, the
waiting turns holding no Hermes slot; the strategies `reject`, `interrupt` and `parallel`; a replica SIGKILLed
while it holds a session."""

from __future__ import annotations

import itertools
import json
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.e2e.conftest import BrokerFactory, BrokerProcess, SimulatorProcess, Store, until
from tests.e2e.test_takeover import FAST

TERMINAL = ("completed", "failed", "cancelled")


def create(broker: BrokerProcess, text: str, session: str | None = None, **scheduling: Any) -> tuple[int, Any]:
    body: dict[str, Any] = {"input": text}
    if session is not None:
        body["session_id"] = session
    if scheduling:
        body["scheduling"] = scheduling
    return broker.request("POST", "/v1/runs", body)


def job(broker: BrokerProcess, job_id: str) -> dict[str, Any]:
    status, view = broker.request("GET", f"/v1/runs/{job_id}")
    assert status == 200, view
    return dict(view)


def timeline(broker: BrokerProcess, job_id: str) -> tuple[float, float]:
    """When Hermes accepted the job's run (the broker's `job.accepted`) and when the job ended (its terminal event)."""
    accepted = ended = None
    with urllib.request.urlopen(f"{broker.url}/v1/runs/{job_id}/events", timeout=30) as stream:
        for raw in stream:
            line = raw.decode().rstrip("\n")
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["event"] == "job.accepted" and accepted is None:
                accepted = float(event["timestamp"])
            if event["event"] in ("run.completed", "run.failed", "run.cancelled"):
                ended = float(event["timestamp"])
    assert accepted is not None and ended is not None, job_id
    return accepted, ended


def ended(broker: BrokerProcess, jobs: list[str]) -> bool:
    return all(job(broker, job_id)["status"] in TERMINAL for job_id in jobs)


def assert_one_at_a_time(broker: BrokerProcess, turns: list[str]) -> None:
    """Each turn's run began after the turn before it had ended, in create order."""
    times = [timeline(broker, job_id) for job_id in turns]
    for (_, before_end), (after_start, _) in itertools.pairwise(times):
        assert after_start >= before_end, times


def test_a_sessions_turns_run_one_at_a_time_in_create_order_and_wait_without_a_slot(
    start_broker: BrokerFactory, clean_store: Store, simulator: SimulatorProcess
) -> None:
    # Given a broker with two Hermes slots
    env = {**FAST, "HERMES_URL": simulator.url, "HERMES_MAX_CONCURRENT": "2"}
    broker = start_broker(redis_url=clean_store.url, **clean_store.variables, **env)
    # When three turns of one session are created at once, then a job without a session
    turns = [create(broker, "turn sleep:1", "s-1")[1]["run_id"] for _ in range(3)]
    other = create(broker, "other sleep:0.2")[1]["run_id"]
    # Then the later turns wait for their session, naming the turn that holds it, while the other job runs in the
    # slot they do not take
    until(lambda: job(broker, turns[0])["status"] == "running", 10, "the first turn runs")
    waiting = job(broker, turns[1])
    assert waiting["status"] == "queued"
    assert waiting["hold"]["reason"] == "session"
    assert turns[0] in waiting["hold"]["detail"] and "s-1" in waiting["hold"]["detail"]
    assert waiting["scheduling"]["multitask"] == "enqueue"
    until(lambda: job(broker, other)["status"] == "completed", 10, "the sessionless job ran beside the first turn")
    _, ready = broker.request("GET", "/readyz")
    assert ready["admission"]["session_waiting"] >= 1
    # And every turn completes, each after the one before it
    until(lambda: ended(broker, turns), 30, "every turn ended")
    assert [job(broker, job_id)["status"] for job_id in turns] == ["completed"] * 3
    assert_one_at_a_time(broker, turns)
    _, ready = broker.request("GET", "/readyz")
    assert ready["admission"]["session_waiting"] == 0


def test_two_replicas_creating_turns_of_one_session_at_once_never_overlap(
    start_broker: BrokerFactory, clean_store: Store, simulator: SimulatorProcess
) -> None:
    # Given two replicas
    env = {**FAST, "HERMES_URL": simulator.url}
    brokers = [start_broker(redis_url=clean_store.url, **clean_store.variables, **env) for _ in range(2)]
    # When both create turns of the same two sessions at once
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: create(brokers[i % 2], f"turn {i} sleep:0.3", f"s-{i % 3 % 2}"), range(12)))
    assert {status for status, _ in answers} == {202}
    jobs = [body["run_id"] for _, body in answers]
    until(lambda: ended(brokers[0], jobs), 60, "every turn ended")
    # Then every turn completed, and no two turns of a session ran at once
    assert {job(brokers[0], job_id)["status"] for job_id in jobs} == {"completed"}
    for session in ("s-0", "s-1"):
        turns = [body["run_id"] for _, body in answers if body["session_id"] == session]
        times = sorted(timeline(brokers[0], job_id) for job_id in turns)
        for (_, before_end), (after_start, _) in itertools.pairwise(times):
            assert after_start >= before_end, (session, times)


def test_reject_answers_409_naming_the_holder_and_stores_nothing(
    start_broker: BrokerFactory, clean_store: Store, simulator: SimulatorProcess
) -> None:
    broker = start_broker(redis_url=clean_store.url, **clean_store.variables, **FAST, HERMES_URL=simulator.url)
    # Given a session with a live turn, created under an Idempotency-Key
    first = {"input": "first sleep:2", "session_id": "s-r"}
    status, held = broker.request("POST", "/v1/runs", first, **{"Idempotency-Key": "turn-1"})
    assert status == 202
    # When another turn asks to be rejected while it runs
    status, answer = create(broker, "second", "s-r", multitask="reject")
    # Then it is refused with 409 session_busy naming the turn that holds the session, and nothing is stored
    assert status == 409, answer
    assert answer["error"]["code"] == "session_busy" and held["run_id"] in answer["error"]["message"]
    _, listing = broker.request("GET", "/v1/runs")
    assert [item["run_id"] for item in listing["data"]] == [held["run_id"]]
    # And a replay of the accepted key is still answered with its job, also with reject
    replay = {**first, "scheduling": {"multitask": "reject"}}
    status, again = broker.request("POST", "/v1/runs", replay, **{"Idempotency-Key": "turn-1"})
    assert status == 202 and again["run_id"] == held["run_id"] and again["replayed"] is True
    # And once the session is free, a rejecting turn is taken
    until(lambda: job(broker, held["run_id"])["status"] == "completed", 15, "the first turn ended")
    status, taken = create(broker, "third", "s-r", multitask="reject")
    assert status == 202 and taken["scheduling"]["multitask"] == "reject"


def test_interrupt_stops_the_earlier_turns_as_superseded_and_runs_after_them(
    start_broker: BrokerFactory, clean_store: Store, simulator: SimulatorProcess
) -> None:
    broker = start_broker(redis_url=clean_store.url, **clean_store.variables, **FAST, HERMES_URL=simulator.url)
    # Given a session with a live turn and a queued one
    live = create(broker, "live slow sleep:30", "s-i")[1]["run_id"]
    until(lambda: job(broker, live)["status"] == "running", 10, "the first turn runs")
    queued = create(broker, "queued sleep:30", "s-i")[1]["run_id"]
    # When a turn interrupts the session
    status, latest = create(broker, "latest sleep:0.2", "s-i", multitask="interrupt")
    assert status == 202
    # Then both earlier turns end cancelled with superseded, and the new turn runs after them and completes
    until(lambda: ended(broker, [live, queued, latest["run_id"]]), 30, "every turn ended")
    for job_id in (live, queued):
        view = job(broker, job_id)
        assert view["status"] == "cancelled" and view["error"]["code"] == "superseded", view
        assert latest["run_id"] in view["error"]["message"]
    assert job(broker, latest["run_id"])["status"] == "completed"
    assert_one_at_a_time(broker, [live, latest["run_id"]])


def test_parallel_turns_run_at_once_and_other_values_are_400(
    start_broker: BrokerFactory, clean_store: Store, simulator: SimulatorProcess
) -> None:
    broker = start_broker(redis_url=clean_store.url, **clean_store.variables, **FAST, HERMES_URL=simulator.url)
    # When two turns of one session ask for no ordering
    turns = [create(broker, "both sleep:2", "s-p", multitask="parallel")[1]["run_id"] for _ in range(2)]
    # Then both run at the same time
    until(lambda: [job(broker, job_id)["status"] for job_id in turns] == ["running"] * 2, 10, "both turns run")
    # And any other strategy is refused, naming the field
    status, answer = create(broker, "x", "s-p", multitask="queue")
    assert status == 400 and answer["error"]["code"] == "invalid_scheduling"
    assert answer["error"]["param"] == "scheduling.multitask"


@pytest.mark.timeout(150)
def test_a_replica_killed_while_its_turn_holds_the_session_hands_it_on_through_the_job(
    start_broker: BrokerFactory, clean_store: Store, simulator: SimulatorProcess
) -> None:
    # Given a replica driving the first turn of a session, with two more turns waiting
    env = {**FAST, "HERMES_URL": simulator.url, "RUNS_LEASE": "1500"}
    doomed = start_broker(redis_url=clean_store.url, **clean_store.variables, **env)
    turns = [create(doomed, "turn slow sleep:3", "s-k")[1]["run_id"] for _ in range(3)]
    until(lambda: job(doomed, turns[0])["status"] == "running", 10, "the first turn runs")
    # When it is SIGKILLed and another replica starts
    doomed.kill()
    survivor = start_broker(redis_url=clean_store.url, **clean_store.variables, **env)
    # Then the first turn is taken over and finished, and the others run after it, one at a time, once each
    try:  # about 10 s here; on a loaded machine far more, and what the replicas did is then the story
        until(lambda: ended(survivor, turns), 120, "every turn ended")
    except AssertionError:
        views = [job(survivor, job_id) for job_id in turns]
        logs = [_story(broker.log_path.read_text())[-6000:] for broker in (doomed, survivor)]
        pytest.fail(f"the turns did not all end: {json.dumps(views)[:3000]}\n" + "\n".join(logs))
    assert [job(survivor, job_id)["status"] for job_id in turns] == ["completed"] * 3
    assert_one_at_a_time(survivor, turns)
    assert sorted(simulator.creates()) == sorted(f"{job_id}" for job_id in turns)


def _story(log: str) -> str:
    """A broker's log without its request lines (the test's polling would fill any tail of it)."""
    return "\n".join(line for line in log.splitlines() if '"Answered a request."' not in line)


def sent_histories(simulator: SimulatorProcess) -> dict[str, Any]:
    """The `conversation_history` of every create Hermes got, by its Idempotency-Key (`<job>` or `<job>#<n>`)."""
    with urllib.request.urlopen(f"{simulator.url}/_sim/requests", timeout=5) as answer:
        requests = json.loads(answer.read())["requests"]
    return {
        r["idempotency_key"]: r.get("conversation_history")
        for r in requests
        if r["method"] == "POST" and r["path"] == "/v1/runs" and r["status"] == 202
    }


def test_session_history_sends_the_earlier_completed_turns_and_the_same_on_a_resubmit(
    start_broker: BrokerFactory, clean_store: Store, simulator: SimulatorProcess
) -> None:
    broker = start_broker(redis_url=clean_store.url, **clean_store.variables, **FAST, HERMES_URL=simulator.url)
    # Given a session whose first turn completed, and whose second was stopped
    first = create(broker, "What is 2+2?", "s-h")[1]["run_id"]
    until(lambda: ended(broker, [first]), 15, "the first turn ended")
    answer = job(broker, first)["output"]
    assert answer
    stopped = create(broker, "never mind sleep:30", "s-h")[1]["run_id"]
    until(lambda: job(broker, stopped)["status"] == "running", 10, "the second turn runs")
    assert broker.request("POST", f"/v1/runs/{stopped}/stop")[0] in (200, 202)
    # When a third turn asks for the session's history, and its run is lost once (a resubmit)
    body = {"input": "And times 3? sleep:1", "session_id": "s-h", "session_history": True}
    status, third = broker.request("POST", "/v1/runs", body)
    assert status == 202
    running = until(lambda: (view := job(broker, third["run_id"]))["status"] == "running" and view, 15, "it runs")
    request = urllib.request.Request(
        f"{simulator.url}/_sim/runs/{running['hermes_run_id']}/interrupt",
        data=json.dumps({"forget": True}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(request, timeout=5).close()
    until(lambda: ended(broker, [third["run_id"]]), 20, "the third turn ended")
    assert job(broker, third["run_id"])["attempts"] == 2
    # Then Hermes got the completed turn as history, the stopped one left out, the same on both attempts
    expected = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": answer}]
    histories = sent_histories(simulator)
    assert histories[third["run_id"]] == expected
    assert histories[f"{third['run_id']}#2"] == expected
    # And the turns without it got none, and the job's own input is unchanged
    assert histories[first] is None and histories[stopped] is None
    assert job(broker, third["run_id"])["status"] == "completed"


def test_session_history_from_the_environment_applies_where_it_can_and_an_explicit_conflict_is_400(
    start_broker: BrokerFactory, clean_store: Store, simulator: SimulatorProcess
) -> None:
    env = {**FAST, "HERMES_URL": simulator.url, "RUNS_SESSION_HISTORY": "true", "RUNS_SESSION_HISTORY_TURNS": "1"}
    broker = start_broker(redis_url=clean_store.url, **clean_store.variables, **env)
    # Given two completed turns of a session
    turns = [create(broker, f"turn {n}", "s-e")[1]["run_id"] for n in range(2)]
    until(lambda: ended(broker, turns), 15, "both turns ended")
    # When a third turn comes without asking, and a sessionless job
    third = create(broker, "turn 2", "s-e")[1]["run_id"]
    alone = create(broker, "alone")[1]["run_id"]
    until(lambda: ended(broker, [third, alone]), 15, "both ended")
    # Then the third got only the latest turn (RUNS_SESSION_HISTORY_TURNS=1), the sessionless job nothing
    histories = sent_histories(simulator)
    latest = job(broker, turns[1])["output"]
    assert histories[third] == [{"role": "user", "content": "turn 1"}, {"role": "assistant", "content": latest}]
    assert histories[turns[0]] is None and histories[alone] is None
    # And an explicit session_history with a turn that is not enqueued is refused, naming the conflict
    status, answer = broker.request(
        "POST",
        "/v1/runs",
        {"input": "x", "session_id": "s-e", "session_history": True, "scheduling": {"multitask": "parallel"}},
    )
    assert status == 400 and answer["error"]["code"] == "invalid_field" and "enqueue" in answer["error"]["message"]
