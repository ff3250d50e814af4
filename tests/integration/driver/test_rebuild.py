"""scripts/rebuild_projections.py: the streams are the truth; stored views are folds that can be rebuilt."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import orjson
from redis.asyncio import Redis

from broker.store import keys
from tests.conftest import RedisServer
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, settled

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "rebuild_projections.py"


async def rebuild(redis_server: RedisServer, *args: str) -> tuple[int, list[dict[str, object]]]:
    env = {**os.environ, "REDIS_URL": redis_server.url}
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, timeout=60, check=False
    )
    return done.returncode, [orjson.loads(line) for line in done.stdout.splitlines() if line.strip()]


async def test_rebuild_finds_and_repairs_a_corrupted_view(
    make_replica: ClientFactory, redis: Redis, redis_server: RedisServer
) -> None:
    # Given finished jobs whose stored views are folds of their streams
    replica = await make_replica(board_enabled=True, board_url="http://127.0.0.1:9/board")
    jobs = [(await create(replica, {"input": text}))["run_id"] for text in ("hello", "fail", "tools:1")]
    finished = [await settled(replica, job) for job in jobs]
    code, lines = await rebuild(redis_server)
    assert code == 0 and lines[-1] == {"jobs": 3, "differing": 0, "written": False}
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
    assert code == 0 and {"job": jobs[0], "replaced": True} in lines
    restored = await (await replica.get(f"/v1/runs/{jobs[0]}")).json()
    assert restored == finished[0]
    code, lines = await rebuild(redis_server)
    assert code == 0 and lines[-1]["differing"] == 0
