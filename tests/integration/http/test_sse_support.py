"""Helpers of the SSE tests (no tests here): create jobs, append events as a driver would, read frames."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import aiohttp
import orjson
from aiohttp.test_utils import TestClient
from attrs import frozen
from redis.asyncio import Redis

from broker.events import HermesEventRecorded, JobEvent, JobFinished, JobStatus, RunAccepted
from broker.store.jobs import JobStore
from projections.job import fold

Client = TestClient[Any, Any]
TERMINAL = {"run.completed", "run.failed", "run.cancelled"}
_clock = [1_796_005_750_000]


def now_ms() -> int:
    _clock[0] += 1
    return _clock[0]


@frozen
class Frame:
    id: str
    data: dict[str, Any]


@frozen
class Comment:
    text: str


async def create_job(client: Client, text: str = "hello") -> str:
    answer = await client.post("/v1/runs", json={"input": text})
    assert answer.status == 202
    return str((await answer.json())["run_id"])


async def append(redis: Redis, job_id: str, events: Sequence[JobEvent]) -> list[str]:
    """Append like the driver: fold the view over the whole stream, no expected last id; relayed Hermes events
    are stored packed (SPEC S3.6), so replay, resume and the live hub read them as every fresh store has them."""
    store = JobStore(redis, retention_ms=600_000, packed=True)
    history = [event for _, event in await store.read(job_id)]
    view = fold([*history, *events])
    assert view is not None
    return await store.append(job_id, list(events), view, expected_last_id=None)


def accepted(job_id: str, attempt: int = 1) -> RunAccepted:
    return RunAccepted(job_id=job_id, at_ms=now_ms(), attempt=attempt, hermes_run_id=f"run_{attempt}")


def delta(job_id: str, text: str, attempt: int = 1) -> HermesEventRecorded:
    at = now_ms()
    body = {"event": "message.delta", "run_id": f"run_{attempt}", "timestamp": at / 1000, "delta": text}
    return HermesEventRecorded(
        job_id=job_id,
        at_ms=at,
        attempt=attempt,
        hermes_run_id=f"run_{attempt}",
        name="message.delta",
        payload=orjson.dumps(body).decode(),
    )


def completed(job_id: str, output: str = "done") -> JobFinished:
    return JobFinished(
        job_id=job_id, at_ms=now_ms(), status=JobStatus.COMPLETED, attempt=1, output=output, usage='{"total_tokens": 3}'
    )


class SseReader:
    """Reads one event-stream response frame by frame (an EventSource, minus reconnects)."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response
        self.raw: list[bytes] = []

    async def item(self, timeout: float = 5.0) -> Frame | Comment | None:
        """The next frame or comment; None at the end of the response."""
        fields: dict[str, str] = {}
        async with asyncio.timeout(timeout):
            while True:
                line = await self.response.content.readline()
                if not line:
                    return None
                self.raw.append(line)
                text = line.decode().rstrip("\n")
                if text.startswith(":"):
                    return Comment(text[1:].strip())
                if text:
                    name, _, value = text.partition(": ")
                    fields[name] = value
                elif fields:
                    assert set(fields) == {"id", "data"}, fields  # never an `event:` line
                    return Frame(fields["id"], orjson.loads(fields["data"]))

    async def frames(self, count: int | None = None, timeout: float = 5.0) -> list[Frame]:
        """Frames (keepalives skipped) until `count`, or until the end of the response."""
        found: list[Frame] = []
        while count is None or len(found) < count:
            item = await self.item(timeout)
            if item is None:
                break
            if isinstance(item, Frame):
                found.append(item)
        return found

    async def rest(self, timeout: float = 5.0) -> list[Frame | Comment]:
        """Everything up to the end of the response."""
        found: list[Frame | Comment] = []
        while (item := await self.item(timeout)) is not None:
            found.append(item)
        return found


async def open_stream(client: Client, job_id: str, **kwargs: Any) -> SseReader:
    response = await client.get(f"/v1/runs/{job_id}/events", **kwargs)
    assert response.status == 200, await response.text()
    assert response.headers["Content-Type"].startswith("text/event-stream")
    return SseReader(response)


async def eventually(check: Callable[[], bool | Awaitable[bool]], timeout: float = 5.0) -> float:
    """Poll `check` until it holds; the seconds it took. Fails past `timeout`."""
    started = time.monotonic()
    while True:
        outcome = check()
        if not isinstance(outcome, bool):
            outcome = await outcome
        if outcome:
            return time.monotonic() - started
        assert time.monotonic() - started < timeout, "condition not met in time"
        await asyncio.sleep(0.01)
