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


def events(items: list[StreamItem]) -> list[HermesEvent]:
    return [item for item in items if isinstance(item, HermesEvent)]


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
