"""Contract: approvals, the concurrency cap and restarts, on the simulator and real Hermes."""

from __future__ import annotations

import asyncio

import orjson

from broker.hermes import Accepted, AiohttpHermesClient, Busy, Forwarded, HermesRun, NotFound, Relayed, StreamEnded
from tests.contract.harness import MAX_CONCURRENT, Target
from tests.contract.helpers import body, collect, create, events, settled, wait_for


def envelope(status: int, message: str, code: str) -> Relayed:
    return Relayed(
        status, {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    )


async def test_a_denied_approval_blocks_the_tool_and_the_run_still_completes(client: AiohttpHermesClient) -> None:
    # Given a run whose tool call waits for approval
    run_id = await create(client, "clean up please approval")
    reader = asyncio.create_task(collect(client, run_id))
    waiting = await wait_for(client, run_id, lambda run: run.status == "waiting_for_approval")
    assert waiting.last_event == "approval.request"
    # When a bad choice and then deny are sent
    assert await client.approval(run_id, b'{"choice":"maybe"}') == envelope(
        400, "Invalid approval choice; expected one of: once, session, always, deny", "invalid_approval_choice"
    )
    answer = {"object": "hermes.run.approval_response", "run_id": run_id, "choice": "deny", "resolved": 1}
    assert await client.approval(run_id, b'{"choice":"DENY"}') == Relayed(200, answer)
    # Then nothing is pending any more, the tool failed, and the run went on to complete
    assert await client.approval(run_id, b'{"choice":"deny"}') == envelope(
        409, f"Run has no pending approval: {run_id}", "approval_not_pending"
    )
    items = await asyncio.wait_for(reader, 30)
    names = [event.name for event in events(items)]
    assert names[:4] == ["tool.started", "approval.request", "approval.responded", "tool.completed"], names
    assert names[-1] == "run.completed" and items[-1] == StreamEnded(clean=True)
    request = events(items)[1].payload
    assert request["choices"] == ["once", "session", "always", "deny"] and isinstance(request["command"], str)
    assert events(items)[2].payload["choice"] == "deny" and events(items)[3].payload["error"] is True
    run = await wait_for(client, run_id, settled)
    assert run.status == "completed"
    assert await client.approval(run_id, b'{"choice":"deny"}') == envelope(
        409, f"Run has no active approval session: {run_id}", "approval_not_active"
    )


async def test_creates_over_the_cap_get_429_with_retry_after(client: AiohttpHermesClient) -> None:
    # Given as many slow runs as the cap allows (earlier tests' runs may still be winding down)
    running = [await _create_when_free(client, "hold the slot sleep:20") for _ in range(MAX_CONCURRENT)]
    try:
        # When one more is created, then Hermes answers 429 rate_limit_exceeded with Retry-After: 1
        assert await client.create(body("one too many")) == Busy(retry_after_s=1.0)
        raw = await client.forward("POST", "/v1/runs", body("one too many"))
        assert isinstance(raw, Forwarded) and raw.status == 429 and raw.headers["Retry-After"] == "1"
        assert orjson.loads(raw.body) == {
            "error": {
                "message": f"Too many concurrent runs (max {MAX_CONCURRENT})",
                "type": "rate_limit_error",
                "param": None,
                "code": "rate_limit_exceeded",
            }
        }
    finally:
        for run_id in running:
            await client.stop(run_id)
        for run_id in running:
            await wait_for(client, run_id, settled)


async def test_a_restart_forgets_every_run(hermes: Target, client: AiohttpHermesClient) -> None:
    # Given a finished run whose stream was never read
    run_id = await create(client, "hello before restart")
    await wait_for(client, run_id, settled)
    # When Hermes restarts
    await asyncio.to_thread(hermes.restart)
    # Then the run is unknown everywhere
    assert await client.get(run_id) == NotFound(run_id)
    assert await collect(client, run_id) == [NotFound(run_id)]
    assert await client.stop(run_id) == NotFound(run_id)
    assert isinstance(await client.get(await create(client, "hello after restart")), HermesRun)


async def _create_when_free(client: AiohttpHermesClient, text: str, timeout_s: float = 20) -> str:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        outcome = await client.create(body(text))
        if isinstance(outcome, Accepted):
            return outcome.run_id
        assert isinstance(outcome, Busy) and loop.time() < deadline, outcome
        await asyncio.sleep(0.5)


async def test_every_kind_of_hermes_answer_counts_as_an_answer_of_the_upstream(client: AiohttpHermesClient) -> None:
    # SPEC S10 "What counts as an answer": a 404 envelope (the health probe's question), and each streamed event
    await client.get("run_not_a_run")
    assert client.heard.answered_ms > 0 and not client.heard.failing
    before = client.heard.answered_ms
    run_id = await create(client, "hello")
    items = await asyncio.wait_for(collect(client, run_id), 30)
    assert events(items) and client.heard.answered_ms >= before and not client.heard.failing
