"""The arq baseline's enqueuer: enqueues N jobs for arq_worker.py, `CREATORS` at a time, and waits for every
result; prints one JSON line `{"started", "results", "commandstats"}`. Runs in the arq virtualenv.

    BENCH_REDIS_URL=redis://... python scripts/bench_baselines/arq_enqueue.py N CREATORS
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from arq import create_pool
from arq.connections import RedisSettings

BODY = {"input": "bench end to end", "instructions": "You review staging promotions."}


async def main(jobs: int, creators: int) -> None:
    pool = await create_pool(RedisSettings.from_dsn(os.environ["BENCH_REDIS_URL"]))
    try:
        warm = await pool.enqueue_job("run_job", BODY)
        assert warm is not None
        await warm.result(timeout=30, poll_delay=0.05)  # the worker is up
        await pool.config_resetstat()
        started = time.time()
        limit = asyncio.Semaphore(creators)

        async def enqueue() -> Any:
            async with limit:
                return await pool.enqueue_job("run_job", BODY)

        queued = await asyncio.gather(*(enqueue() for _ in range(jobs)))
        results = [await job.result(timeout=60 + jobs / 5, poll_delay=0.1) for job in queued]
        stats = await pool.info("commandstats")
    finally:
        await pool.aclose()
    print(json.dumps({"started": started, "results": results, "commandstats": stats}))


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2])))
