"""GET /v1/runs/{id}/events: replay, resume, errors and the end of a finished job (SPEC S3.3)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis

from broker.events import DeltasDropped
from tests.conftest import BOTH_BACKENDS
from tests.integration.http.test_sse_support import (
    Client,
    Comment,
    Frame,
    accepted,
    append,
    completed,
    create_job,
    delta,
    now_ms,
    open_stream,
)

pytestmark = BOTH_BACKENDS


async def finished_job(client: Client, redis: Redis) -> tuple[str, list[str]]:
    job = await create_job(client)
    ids = await append(redis, job, [accepted(job), delta(job, "Hello "), delta(job, "world"), completed(job, "Hi")])
    return job, ids


async def test_a_finished_job_replays_everything_and_closes(client: Client, redis: Redis) -> None:
    # Given a job that ran and completed
    job, ids = await finished_job(client, redis)
    # When a client subscribes without a last id
    reader = await open_stream(client, job)
    items = await reader.rest()
    # Then it sees every event from the start, one terminal event, then the closing comment
    frames = [item for item in items if isinstance(item, Frame)]
    assert [frame.data["event"] for frame in frames] == [
        "job.queued",
        "job.accepted",
        "message.delta",
        "message.delta",
        "run.completed",
    ]
    assert [frame.id for frame in frames][1:] == ids
    assert items[-1] == Comment("stream closed")
    assert all(frame.data["run_id"] == job for frame in frames)
    assert frames[2].data["hermes_run_id"] == "run_1" and frames[2].data["attempt"] == 1
    assert frames[-1].data["output"] == "Hi" and frames[-1].data["usage"] == {"total_tokens": 3}
    assert reader.response.headers["Cache-Control"] == "no-cache"
    assert b"".join(reader.raw).startswith(f"id: {frames[0].id}\ndata: {{".encode())


@pytest.mark.parametrize(
    ("header", "query", "resume_at"),
    [
        ("3", None, 3),  # Last-Event-ID
        (None, "2", 2),  # ?after=
        ("3", "1", 3),  # the header wins
        ("", "2", 2),  # an empty header counts as absent
        ("", "", 0),  # both empty: from the start
    ],
)
async def test_resume_strictly_after_the_given_id(
    client: Client, redis: Redis, header: str | None, query: str | None, resume_at: int
) -> None:
    job, _ = await finished_job(client, redis)
    everything = await (await open_stream(client, job)).frames()
    ids = [frame.id for frame in everything]
    headers = {"Last-Event-ID": ids[int(header)] if header else ""} if header is not None else {}
    params = {"after": ids[int(query)] if query else ""} if query is not None else {}
    frames = await (await open_stream(client, job, headers=headers, params=params)).frames()
    start = resume_at + 1 if (header or query) else 0
    assert [frame.id for frame in frames] == ids[start:]


async def test_resuming_after_the_terminal_event_just_closes(client: Client, redis: Redis) -> None:
    job, ids = await finished_job(client, redis)
    reader = await open_stream(client, job, headers={"Last-Event-ID": ids[-1]})
    assert await reader.rest() == [Comment("stream closed")]


@pytest.mark.parametrize(
    "bad", ["abc", "1-", "-1", "1-2-3", "1.5-0", "99999999999999999999-0", "1-0x", "\u0661-\u0660"]
)
async def test_a_malformed_last_event_id_is_a_400_envelope(client: Client, redis: Redis, bad: str) -> None:
    job, _ = await finished_job(client, redis)
    attempts: list[tuple[dict[str, Any], str]] = [({"params": {"after": bad}}, "after")]
    if bad.isascii():  # the header wins over a good `after`, and the answer names what was sent
        attempts.append(({"headers": {"Last-Event-ID": bad}, "params": {"after": "1-0"}}, "Last-Event-ID"))
    for kwargs, param in attempts:
        answer = await client.get(f"/v1/runs/{job}/events", **kwargs)
        assert answer.status == 400
        error = (await answer.json())["error"]
        assert error["code"] == "invalid_last_event_id" and error["type"] == "invalid_request_error"
        assert error["param"] == param and error["message"].startswith(f"{param} must be an event id")


@pytest.mark.parametrize("run_id", ["job_0123456789abcdef0123456789abcdef", "run_abc", "x"])
async def test_an_unknown_run_is_a_404_envelope(client: Client, run_id: str) -> None:
    answer = await client.get(f"/v1/runs/{run_id}/events")
    assert answer.status == 404
    assert (await answer.json())["error"] == {
        "message": f"Run not found: {run_id}",
        "type": "invalid_request_error",
        "param": None,
        "code": "run_not_found",
    }


async def test_events_the_feed_does_not_show_are_skipped(client: Client, redis: Redis) -> None:
    job = await create_job(client)
    dropped = DeltasDropped(job_id=job, at_ms=now_ms(), attempt=1, count=3)
    ids = await append(redis, job, [accepted(job), dropped, delta(job, "x"), completed(job)])
    frames = await (await open_stream(client, job)).frames()
    assert [frame.id for frame in frames][1:] == [ids[0], ids[2], ids[3]]
