"""The relay baseline: a bare loop in one process that creates runs on Hermes (the simulator), reads their
event streams and XADDs each batch of events it read in one pipelined round trip.

    BENCH_REDIS_URL=... BENCH_HERMES_URL=... BENCH_RUNS=64 BENCH_INPUT="deltas:1000" BENCH_PREFIX=relay: \
        python scripts/bench_baselines/relay.py

Run i's events go to the stream `<prefix><i>` (field `e` = the event's JSON, as Hermes sent it). Prints one
JSON line when every stream ended: {"events", "started", "ended"} (epoch seconds).
"""

from __future__ import annotations

import asyncio
import json
import os
import time

import aiohttp
from redis.asyncio import Redis


async def relay(session: aiohttp.ClientSession, redis: Redis, hermes: str, text: str, stream: str) -> int:
    async with session.post(f"{hermes}/v1/runs", json={"input": text}) as answer:
        answer.raise_for_status()
        run_id = (await answer.json())["run_id"]
    count, rest = 0, b""
    async with session.get(f"{hermes}/v1/runs/{run_id}/events") as events:
        async for chunk in events.content.iter_any():
            frames = (rest + chunk).split(b"\n\n")
            rest = frames.pop()
            batch = [frame[5:].strip() for frame in frames if frame.startswith(b"data:")]
            if batch:
                pipe = redis.pipeline(transaction=False)
                for payload in batch:
                    pipe.xadd(stream, {"e": payload})
                await pipe.execute()
                count += len(batch)
    return count


async def main() -> None:
    redis = Redis.from_url(os.environ["BENCH_REDIS_URL"])
    hermes = os.environ["BENCH_HERMES_URL"]
    runs, text, prefix = int(os.environ["BENCH_RUNS"]), os.environ["BENCH_INPUT"], os.environ["BENCH_PREFIX"]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        started = time.time()
        counts = await asyncio.gather(*(relay(session, redis, hermes, text, f"{prefix}{i}") for i in range(runs)))
        ended = time.time()
    await redis.aclose()
    print(json.dumps({"events": sum(counts), "started": started, "ended": ended}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
