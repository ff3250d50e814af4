"""A conversation's turns against both Hermes targets (SPEC S4.3): the real hermes-agent 0.19.0 runs two creates of
one session at once; through the broker they run one after another, and with `session_history` the second turn's
model call holds the first turn's question and answer. On the real Hermes what the model saw is read from the stub
LLM's log of calls; on the simulator from its request log."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from typing import Any

from aiohttp.test_utils import TestClient

from tests.contract.harness import RealTarget, Target
from tests.contract.test_driving import status_in, until

TERMINAL = ("completed", "failed", "cancelled")


async def create(client: TestClient[Any, Any], body: dict[str, Any]) -> dict[str, Any]:
    answer = await client.post("/v1/runs", json=body)
    assert answer.status == 202, await answer.text()
    created: dict[str, Any] = await answer.json()
    return created


async def timeline(client: TestClient[Any, Any], job_id: str) -> tuple[float, float]:
    """When Hermes accepted the job's run (`job.accepted`) and when the job ended (its terminal event)."""
    accepted = ended = None
    async with client.get(f"/v1/runs/{job_id}/events") as stream:
        async for raw in stream.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("data: "):
                event = json.loads(line[6:])
                if event["event"] == "job.accepted" and accepted is None:
                    accepted = float(event["timestamp"])
                if event["event"] in ("run.completed", "run.failed", "run.cancelled"):
                    ended = float(event["timestamp"])
    assert accepted is not None and ended is not None
    return accepted, ended


def model_calls(hermes: Target, marker: str) -> list[dict[str, Any]]:
    """The stub LLM's agent calls whose last user message holds `marker` (real Hermes only)."""
    assert isinstance(hermes, RealTarget)
    calls = [json.loads(line) for line in hermes.llm_calls_path.read_text().splitlines() if line]
    return [call for call in calls if marker in _last_user(call["messages"])]


def _last_user(messages: list[dict[str, Any]]) -> str:
    users = [str(m.get("content")) for m in messages if m.get("role") == "user"]
    return users[-1] if users else ""


def sim_histories(hermes: Target) -> dict[str, Any]:
    """The simulator's log: the `conversation_history` each accepted create got, by its Idempotency-Key."""
    with urllib.request.urlopen(f"{hermes.base_url}/_sim/requests", timeout=10) as answer:
        requests = json.load(answer)["requests"]
    return {
        r["idempotency_key"]: r.get("conversation_history")
        for r in requests
        if r["method"] == "POST" and r["path"] == "/v1/runs" and r["status"] == 202
    }


async def test_two_turns_created_at_once_run_one_after_the_other(broker: TestClient[Any, Any], hermes: Target) -> None:
    # When two turns of one session are created at the same moment
    session = f"s-order-{hermes.name}"
    first, second = await asyncio.gather(
        create(broker, {"input": "turn alpha sleep:2", "session_id": session}),
        create(broker, {"input": "turn beta sleep:2", "session_id": session}),
    )
    for job in (first, second):
        done = await until(status_in(broker, job["run_id"], *TERMINAL), 90)
        assert done["status"] == "completed", done
    # Then the later one's run began only after the earlier one's ended
    times = sorted([await timeline(broker, first["run_id"]), await timeline(broker, second["run_id"])])
    assert times[1][0] >= times[0][1], times
    if isinstance(hermes, RealTarget):  # and the model never served both at once
        alpha, beta = model_calls(hermes, "turn alpha"), model_calls(hermes, "turn beta")
        assert alpha and beta
        earlier, later = (
            (alpha, beta) if min(c["start"] for c in alpha) < min(c["start"] for c in beta) else (beta, alpha)
        )
        assert max(c["end"] for c in earlier) <= min(c["start"] for c in later), (alpha, beta)


async def test_session_history_gives_the_second_turn_the_first_ones_question_and_answer(
    broker: TestClient[Any, Any], hermes: Target
) -> None:
    # Given a session whose first turn completed
    session = f"s-history-{hermes.name}"
    first = await create(broker, {"input": "Which colour is the sky?", "session_id": session})
    answered = await until(status_in(broker, first["run_id"], *TERMINAL), 90)
    assert answered["status"] == "completed" and answered["output"], answered
    # When the second turn asks for the session's history
    second = await create(broker, {"input": "And at night?", "session_id": session, "session_history": True})
    done = await until(status_in(broker, second["run_id"], *TERMINAL), 90)
    assert done["status"] == "completed", done
    # Then Hermes got the first turn's question and answer before the second's question
    expected = [
        {"role": "user", "content": "Which colour is the sky?"},
        {"role": "assistant", "content": answered["output"]},
    ]
    if isinstance(hermes, RealTarget):  # what the model saw
        calls = model_calls(hermes, "And at night?")
        assert calls
        seen = [
            (m.get("role"), m.get("content")) for m in calls[0]["messages"] if m.get("role") in ("user", "assistant")
        ]
        wanted = [(m["role"], m["content"]) for m in expected] + [("user", "And at night?")]
        assert seen[-3:] == wanted, seen
    else:
        histories = sim_histories(hermes)
        assert histories[second["run_id"]] == expected
        assert histories[first["run_id"]] is None
