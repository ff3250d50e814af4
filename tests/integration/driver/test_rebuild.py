"""scripts/rebuild_projections.py: the streams are the truth; stored views are folds that can be rebuilt."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.store import keys
from tests.conftest import RedisServer
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, settled

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "scripts" / "rebuild_projections.py"


async def run_rebuild(
    redis_server: RedisServer, *args: str, env: dict[str, str] | None = None
) -> tuple[int, list[dict[str, object]], str]:
    """Run the script on this worktree's code (not an installed copy): exit code, stdout JSON lines, stderr."""
    environ = {**os.environ, "REDIS_URL": redis_server.url, "PYTHONPATH": str(ROOT), **(env or {})}
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(SCRIPT), *args], env=environ, capture_output=True, timeout=60, check=False
    )
    lines = [orjson.loads(line) for line in done.stdout.splitlines() if line.strip()]
    return done.returncode, lines, done.stderr.decode()


async def rebuild(redis_server: RedisServer, *args: str) -> tuple[int, list[dict[str, object]]]:
    code, lines, _ = await run_rebuild(redis_server, *args)
    return code, lines


async def test_rebuild_finds_and_repairs_a_corrupted_view(
    make_replica: ClientFactory, redis: Redis, redis_server: RedisServer
) -> None:
    # Given finished jobs whose stored views are folds of their streams
    replica = await make_replica(board_enabled=True, board_url="http://127.0.0.1:9/board")
    jobs = [(await create(replica, {"input": text}))["run_id"] for text in ("hello", "fail", "tools:1")]
    finished = [await settled(replica, job) for job in jobs]
    code, lines = await rebuild(redis_server)
    assert code == 0 and lines[-1] == {"jobs": 3, "differing": 0, "written": False, "replaced": 0}
    # When one stored view is corrupted behind the broker's back
    view_key = keys.view(jobs[0])
    state = orjson.loads(await redis.hget(view_key, "state"))  # type: ignore[arg-type]
    state["status"], state["output"] = "failed", None
    await redis.hset(view_key, "state", orjson.dumps(state))  # type: ignore[misc]
    # Then a dry run reports exactly that job and changes nothing
    code, lines = await rebuild(redis_server)
    assert code == 1 and lines[-1]["differing"] == 1
    assert lines[0]["job"] == jobs[0] and "view" in lines[0]["differences"]  # type: ignore[operator]
    assert (await (await replica.get(f"/v1/runs/{jobs[0]}")).json())["status"] == "failed"
    # And --write restores the fold, after which the stored object is the original again
    code, lines = await rebuild(redis_server, "--write")
    assert code == 0 and lines[0]["job"] == jobs[0] and lines[0]["replaced"] is True
    restored = await (await replica.get(f"/v1/runs/{jobs[0]}")).json()
    assert restored == finished[0]
    code, lines = await rebuild(redis_server)
    assert code == 0 and lines[-1]["differing"] == 0


DEAD_BOARD = "http://127.0.0.1:9/board"  # nothing listens: versions stay pending, the board hash stays put
BOARD_ENV = {"BOARD_ENABLED": "true", "BOARD_URL": DEAD_BOARD}


async def _stored(redis: Redis, job_id: str) -> dict[str, object]:
    """Everything a job write leaves of a job's projections (TTLs as present or not)."""
    return {
        "view": await redis.hgetall(keys.view(job_id)),  # type: ignore[misc]
        "board": await redis.hgetall(keys.board(job_id)),  # type: ignore[misc]
        "view_ttl": await redis.pttl(keys.view(job_id)) > 0,
        "board_ttl": await redis.pttl(keys.board(job_id)) > 0,
        "indexed": await redis.zscore(keys.BOARD_INDEX, job_id),
    }


async def _body(client: TestClient[Any, Any], job_id: str) -> bytes:
    response = await client.get(f"/v1/runs/{job_id}")
    assert response.status == 200
    return await response.read()


async def test_rebuild_names_exactly_the_damaged_jobs_and_restores_them_byte_for_byte(
    make_replica: ClientFactory, make_client: ClientFactory, redis: Redis, redis_server: RedisServer
) -> None:
    # Given five finished jobs of a board-enabled replica, their answers and stored projections captured
    replica = await make_replica(board_enabled=True, board_url=DEAD_BOARD)
    jobs = [
        (await create(replica, {"input": text}))["run_id"] for text in ("hello", "fail", "tools:1", "tools:2", "bye")
    ]
    for job_id in jobs:
        await settled(replica, job_id)
    bodies = {job_id: await _body(replica, job_id) for job_id in jobs}
    before = {job_id: await _stored(redis, job_id) for job_id in jobs}
    assert all(before[job_id]["board"] and "board" in before[job_id]["view"] for job_id in jobs)  # type: ignore[operator]
    # When four are damaged behind the broker's back and one is left alone
    missing_all, missing_view, bad_state, bad_board, _intact = jobs
    await redis.delete(keys.view(missing_all), keys.board(missing_all))
    await redis.delete(keys.view(missing_view))
    await redis.hset(keys.view(bad_state), "state", '{"job_id": tru')  # type: ignore[misc]
    await redis.hset(keys.view(bad_board), "board", "[not a board state")  # type: ignore[misc]
    await redis.hset(keys.board(bad_board), "latest", "garbage")  # type: ignore[misc]
    damaged = await _stored(redis, missing_all)
    # Then a dry run counts every job stream, names exactly the damaged ones and changes nothing
    code, lines, stderr = await run_rebuild(redis_server, env=BOARD_ENV)
    assert code == 1, stderr
    assert lines[-1] == {"jobs": 5, "differing": 4, "written": False, "replaced": 0}
    found = {str(line["job"]): line["differences"] for line in lines[:-1]}
    assert set(found) == {missing_all, missing_view, bad_state, bad_board}
    assert found[missing_all]["view"]["problem"] == "missing"  # type: ignore[index]
    assert found[missing_all]["board_report"]["problem"] == "missing"  # type: ignore[index]
    assert set(found[missing_view]) == {"view", "last_id", "board_state"}  # type: ignore[arg-type]
    assert found[bad_state]["view"]["problem"] == "undecodable"  # type: ignore[index]
    assert set(found[bad_board]) == {"board_state", "board_report"}  # type: ignore[arg-type]
    assert found[bad_board]["board_state"]["problem"] == "undecodable"  # type: ignore[index]
    assert "rebuild: done, 5 jobs read, 4 differing, 0 replaced" in stderr
    assert await _stored(redis, missing_all) == damaged
    # And --write restores each of them as the job writes had stored it
    code, lines, stderr = await run_rebuild(redis_server, "--write", env=BOARD_ENV)
    assert code == 0, stderr
    assert lines[-1] == {"jobs": 5, "differing": 4, "written": True, "replaced": 4}
    assert all(line["replaced"] is True for line in lines[:-1])
    assert {job_id: await _stored(redis, job_id) for job_id in jobs} == before
    # And a broker serving this Redis answers every job byte for byte as before the damage
    fresh = await make_client()
    assert {job_id: await _body(fresh, job_id) for job_id in jobs} == bodies
    code, lines, _ = await run_rebuild(redis_server, env=BOARD_ENV)
    assert code == 0 and lines[-1]["differing"] == 0


async def test_rebuild_of_jobs_written_without_boards_writes_no_board_state(
    make_replica: ClientFactory, redis: Redis, redis_server: RedisServer
) -> None:
    # Given finished jobs of a replica with boards off (no board state, no board hash)
    replica = await make_replica()
    jobs = [(await create(replica, {"input": text}))["run_id"] for text in ("hello", "fail", "bye")]
    for job_id in jobs:
        await settled(replica, job_id)
    before = {job_id: await _stored(redis, job_id) for job_id in jobs}
    # When one view is deleted and one is garbage
    await redis.delete(keys.view(jobs[0]))
    await redis.hset(keys.view(jobs[1]), "state", "\xff not json")  # type: ignore[misc]
    # Then --job looks at that one job only, with progress on stderr
    code, lines, stderr = await run_rebuild(redis_server, "--job", jobs[0], "--progress-every", "1")
    assert code == 1 and [line.get("job") for line in lines] == [jobs[0], None]
    assert lines[-1] == {"jobs": 1, "differing": 1, "written": False, "replaced": 0}
    assert "rebuild: 1 jobs read, 1 differing" in stderr
    # And --write restores both views exactly, without inventing board state
    code, lines, _ = await run_rebuild(redis_server, "--write")
    assert code == 0 and lines[-1] == {"jobs": 3, "differing": 2, "written": True, "replaced": 2}
    assert {job_id: await _stored(redis, job_id) for job_id in jobs} == before
    # And a job without a stream is named as such
    code, lines, stderr = await run_rebuild(redis_server, "--job", "job_nope")
    assert code == 2 and "Job job_nope has no event stream." in stderr
