"""The end-to-end baseline, "what a user would write instead": an arq worker whose job creates a run on
Hermes (the simulator) and reads its event stream to the end.

    BENCH_REDIS_URL=redis://... BENCH_HERMES_URL=http://... python scripts/bench_baselines/arq_worker.py

64 jobs at once (the broker's RUNS_CONCURRENCY default); the queue is polled every 50 ms (arq's default is
500 ms, which would cap a burst at 128 jobs/s). A 429 is retried after a second, as a careful user would.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import aiohttp
from arq import run_worker
from arq.connections import RedisSettings

HERMES = os.environ.get("BENCH_HERMES_URL", "http://127.0.0.1:8642")


async def startup(ctx: dict[str, Any]) -> None:
    ctx["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))


async def shutdown(ctx: dict[str, Any]) -> None:
    await ctx["session"].close()


async def run_job(ctx: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    session: aiohttp.ClientSession = ctx["session"]
    while True:
        async with session.post(f"{HERMES}/v1/runs", json=body) as answer:
            if answer.status == 429:
                await asyncio.sleep(1)
                continue
            answer.raise_for_status()
            run_id = (await answer.json())["run_id"]
            break
    events = 0
    async with session.get(f"{HERMES}/v1/runs/{run_id}/events") as stream:
        async for line in stream.content:
            events += line.startswith(b"data:")
    return {"finished": time.time(), "events": events, "run_id": run_id}


class WorkerSettings:
    functions = [run_job]  # noqa: RUF012  (arq reads class attributes)
    redis_settings = RedisSettings.from_dsn(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0"))
    max_jobs = 64
    poll_delay = 0.05
    job_timeout = 300
    keep_result = 3600
    on_startup = startup
    on_shutdown = shutdown


if __name__ == "__main__":
    run_worker(WorkerSettings)  # type: ignore[arg-type]
