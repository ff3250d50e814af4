"""Deltas serve live readers (SPEC S3.6, S3.3): a finished job's message deltas are removed
RUNS_DELTA_RETENTION after it ended; nothing else about the job changes, and replay and resume go on."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.board.projector import BoardSettings
from broker.clock import SystemClock
from broker.jobs.deltas import DeltaSweep
from broker.rebuild import RebuildSettings, compare
from broker.simulator.state import Simulator
from broker.store import keys
from broker.store.deltas import DeltaSchedule
from broker.store.jobs import JobStore
from broker.store.rebuild import RebuildStore
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled

pytestmark = BOTH_BACKENDS

DEAD_BOARD = "http://127.0.0.1:9/board"  # versions stay pending in the board hash: it is compared as it stands
BOARD = {"board_enabled": True, "board_url": DEAD_BOARD, "board_retries": 1}
REBUILD = RebuildSettings(
    board=BoardSettings(platform="runs", ttl_ms=86_400_000, refresh_ms=60_000), board_enabled=True
)


async def _frames(client: TestClient[Any, Any], job_id: str, after: str | None = None) -> list[tuple[str, bytes]]:
    """The (id, data line) of every frame a replay (or a resume after `after`) sends, up to the stream's end."""
    headers = {"Last-Event-ID": after} if after else {}
    answer = await client.get(f"/v1/runs/{job_id}/events", headers=headers)
    assert answer.status == 200
    text = await answer.read()
    frames = []
    for block in text.split(b"\n\n"):
        lines = block.split(b"\n")
        if lines[0].startswith(b"id: "):
            frames.append((lines[0][4:].decode(), lines[1]))
    return frames


#: The view hash's fields of its view JSON: `state`, or after the window a lean one (broker/store/lean.py)
VIEW_JSON = ("deltas_removed", keys.VIEW_STATE, keys.VIEW_LEAN, keys.VIEW_OUTPUT_AT)


async def _state(redis: Redis, client: TestClient[Any, Any], job_id: str) -> dict[str, object]:
    """Everything of a job that must not change when its deltas go (SPEC S3.6)."""
    partition = keys.partition_of(job_id)
    view = await redis.hgetall(keys.view(job_id))  # type: ignore[misc]
    listed = await client.get("/v1/runs")
    assert listed.status == 200
    return {
        "job": await job(client, job_id),
        "listing": (await listed.json())["data"],
        "loaded": await JobStore(redis, retention_ms=86_400_000).load(job_id),
        "view": {field: value for field, value in view.items() if field not in VIEW_JSON},
        "board": await redis.hgetall(keys.board(job_id)),  # type: ignore[misc]
        "listed": [
            await redis.zscore(key, job_id) for key in (keys.runs(partition), keys.runs_index(partition, "completed"))
        ],
        "board_index": await redis.zscore(keys.board_index(partition), job_id),
    }


def _is_delta(data: bytes) -> bool:
    return bool(orjson.loads(data.removeprefix(b"data: "))["event"] == "message.delta")


async def test_deltas_go_after_the_window_and_nothing_else_changes(make_replica: ClientFactory, redis: Redis) -> None:
    # Given a finished job of a realistic shape (tools, then many small deltas), board on, deltas due in a minute
    replica = await make_replica(runs_delta_retention_ms=60_000, **BOARD)
    job_id = (await create(replica, {"input": "answer tools:3 deltas:120"}))["run_id"]
    assert (await settled(replica, job_id))["status"] == "completed"
    partition = keys.partition_of(job_id)
    due = await redis.zscore(keys.deltas(partition), job_id)
    view = await job(replica, job_id)
    assert due is not None and abs(due - view["updated_at"] * 1000 - 60_000) < 2
    before_frames = await _frames(replica, job_id)
    before = await _state(redis, replica, job_id)
    deltas = [entry_id for entry_id, data in before_frames if _is_delta(data)]
    assert len(deltas) == 120
    raw = [fields[keys.EVENT_FIELD] for entry_id, fields in await redis.xrange(keys.events(job_id))]
    assert sum(entry.startswith("[") for entry in raw) == 120 + 6 + 1  # deltas, tools and reasoning are packed
    memory = await redis.memory_usage(keys.events(job_id))
    view_memory = await redis.memory_usage(keys.view(job_id))
    last_id = (await redis.xinfo_stream(keys.events(job_id)))["last-generated-id"]
    stored_view = orjson.loads(await redis.hget(keys.view(job_id), keys.VIEW_STATE))  # type: ignore[misc]

    # When the window has passed (the schedule says so) and a replica's sweep runs
    await redis.zadd(keys.deltas(partition), {job_id: 1})
    assert await DeltaSweep(DeltaSchedule(redis), SystemClock()).sweep() == 120

    # Then the replay shows every other event with its original id, byte for byte, and no delta
    after_frames = await _frames(replica, job_id)
    assert after_frames == [(entry_id, data) for entry_id, data in before_frames if not _is_delta(data)]
    assert orjson.loads(after_frames[-1][1].removeprefix(b"data: "))["output"].count("d") == 120
    # And a resume from any id, a removed delta's included, starts strictly after it
    for removed in (deltas[0], deltas[57], deltas[-1]):
        expected = [
            (i, d) for i, d in after_frames if tuple(map(int, i.split("-"))) > tuple(map(int, removed.split("-")))
        ]
        assert await _frames(replica, job_id, after=removed) == expected
    # And the job object, its view, board versions, listing entries and the rebuild are unchanged
    assert await _state(redis, replica, job_id) == before
    assert compare(await RebuildStore(redis).read(job_id), REBUILD, view["updated_at"] * 1000) is None
    # And the view keeps its output only in the terminal entry (the store's switch is on: a fresh store)
    hashed = await redis.hgetall(keys.view(job_id))  # type: ignore[misc]
    assert keys.VIEW_STATE not in hashed and orjson.loads(hashed[keys.VIEW_LEAN]) == {
        name: value for name, value in stored_view.items() if name != "output"
    }
    assert hashed[keys.VIEW_OUTPUT_AT] == after_frames[-1][0]
    assert await redis.memory_usage(keys.view(job_id)) < view_memory  # by about the output (allocator classes)
    # And the stream gave its room back, kept its last id, and is off the schedule
    assert await redis.memory_usage(keys.events(job_id)) < memory / 2
    assert (await redis.xinfo_stream(keys.events(job_id)))["last-generated-id"] == last_id
    assert await redis.zscore(keys.deltas(partition), job_id) is None
    assert await DeltaSweep(DeltaSchedule(redis), SystemClock()).sweep() == 0


async def test_a_replica_removes_them_on_its_own_and_a_running_job_keeps_its_deltas(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given a replica with a short delta window, a job that finishes and one that streams for long
    replica = await make_replica(runs_delta_retention_ms=300)
    done = (await create(replica, {"input": "short deltas:30"}))["run_id"]
    running = (await create(replica, {"input": "long deltas:30 sleep:8"}))["run_id"]
    assert (await settled(replica, done))["status"] == "completed"

    async def streamed() -> bool:
        return await redis.xlen(keys.events(running)) > 4

    await eventually(streamed)
    kept = await redis.xlen(keys.events(running))

    # When the window passes, then the finished job's deltas are gone, the running job keeps every one
    async def removed() -> bool:
        return not await redis.exists(keys.view(done)) or bool(await redis.hget(keys.view(done), "deltas_removed"))

    await eventually(removed, timeout=10)
    assert await redis.hget(keys.view(done), "deltas_removed") == "30"
    assert not [f for f in await _frames(replica, done) if _is_delta(f[1])]
    assert await redis.zscore(keys.deltas(keys.partition_of(running)), running) is None
    assert await redis.xlen(keys.events(running)) >= kept
    assert (await job(replica, running))["status"] == "running"


async def test_a_zero_window_keeps_the_deltas_as_long_as_the_job(make_replica: ClientFactory, redis: Redis) -> None:
    replica = await make_replica(runs_delta_retention_ms=0)
    job_id = (await create(replica, {"input": "kept deltas:20"}))["run_id"]
    assert (await settled(replica, job_id))["status"] == "completed"
    assert await redis.zscore(keys.deltas(keys.partition_of(job_id)), job_id) is None
    assert len([f for f in await _frames(replica, job_id) if _is_delta(f[1])]) == 20
