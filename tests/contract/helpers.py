"""Small async helpers shared by the contract tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import aclosing

import orjson

from broker.hermes import Accepted, AiohttpHermesClient, HermesEvent, HermesRun
from broker.hermes.models import StreamItem


def body(text: str, **extra: object) -> bytes:
    return orjson.dumps({"input": text, **extra})


async def create(client: AiohttpHermesClient, text: str) -> str:
    outcome = await client.create(body(text))
    assert isinstance(outcome, Accepted), outcome
    assert outcome.run_id.startswith("run_") and len(outcome.run_id) == 36
    return outcome.run_id


async def collect(client: AiohttpHermesClient, run_id: str, idle_timeout_s: float = 30) -> list[StreamItem]:
    async with aclosing(client.events(run_id, idle_timeout_s=idle_timeout_s)) as stream:
        return [item async for item in stream]


#: The fields of each event type, as Hermes 0.19.0 sends them.
EVENT_FIELDS = {
    "message.delta": {"delta"},
    "reasoning.available": {"text"},
    "tool.started": {"tool", "preview"},
    "tool.completed": {"tool", "duration", "error"},
    "approval.request": {"command", "pattern_key", "pattern_keys", "description", "allow_permanent", "choices"},
    "approval.responded": {"choice", "resolved"},
    "run.completed": {"output", "usage"},
    "run.failed": {"error"},
    "run.cancelled": set(),
}
#: The fields of the run object, by status (`last_event` appears with the first tool/approval/terminal event).
RUN_FIELDS = {"object", "run_id", "status", "created_at", "updated_at", "session_id", "model", "last_event"}
RUN_EXTRA = {"completed": {"output", "usage"}, "failed": {"error"}}


def events(items: list[StreamItem]) -> list[HermesEvent]:
    """The events among the stream's items, each checked to carry exactly its type's fields."""
    received = [item for item in items if isinstance(item, HermesEvent)]
    for event in received:
        assert set(event.payload) == {"event", "run_id", "timestamp"} | EVENT_FIELDS[event.name], event.payload
    return received


def assert_run_fields(run: HermesRun) -> None:
    assert set(run.raw) == RUN_FIELDS | RUN_EXTRA.get(run.status, set()), run.raw


async def wait_for(
    client: AiohttpHermesClient, run_id: str, done: Callable[[HermesRun], bool], timeout_s: float = 30
) -> HermesRun:
    """Poll GET until `done(run)`; fail with the last answer after the deadline."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        run = await client.get(run_id)
        if isinstance(run, HermesRun) and done(run):
            return run
        assert loop.time() < deadline, f"run {run_id} never got there; last answer {run}"
        await asyncio.sleep(0.1)


def settled(run: HermesRun) -> bool:
    return run.terminal
