"""Benchmarks, each printed side by side with a baseline measured in the same run.

    python scripts/bench.py [--requests 2000] [--concurrency 32] [--subscribers 200]

- create: POST /v1/runs on the broker (validation, one Lua script: stream + view + work + schedule) against
  a bare aiohttp handler doing one Redis XADD (the floor for "durable before the answer");
- poll: GET /v1/runs/{id} against a bare handler doing one HGET;
- fan-out: time until every SSE subscriber of one job saw an appended event, against the same number of
  plain XREAD BLOCK readers on a dedicated connection each.
Starts its own redis-server on a free loopback port; only loopback traffic; bounded in count.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable

import aiohttp
from aiohttp import web
from redis.asyncio import Redis

from broker.config import Config
from broker.events import HermesEventRecorded
from broker.http.app import create_app
from broker.store.jobs import JobStore
from projections.job import fold


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def baseline_app(redis_url: str) -> web.Application:
    app = web.Application()
    redis = Redis.from_url(redis_url, decode_responses=True)

    async def create(request: web.Request) -> web.Response:
        body = await request.read()
        entry = await redis.xadd("bench:baseline", {"e": body})
        return web.json_response({"run_id": entry}, status=202)

    async def get(request: web.Request) -> web.Response:
        return web.json_response({"state": await redis.hget("bench:baseline:view", "state")})

    async def close(_: web.Application) -> None:
        await redis.aclose()

    app.router.add_post("/v1/runs", create)
    app.router.add_get("/v1/runs/{id}", get)
    app.on_cleanup.append(close)
    return app


async def load(count: int, concurrency: int, request: Callable[[int], Awaitable[None]]) -> tuple[list[float], float]:
    latencies: list[float] = []
    queue = iter(range(count))

    async def worker() -> None:
        for n in queue:
            started = time.perf_counter()
            await request(n)
            latencies.append((time.perf_counter() - started) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return latencies, count / (time.perf_counter() - started)


def figures(latencies: list[float], rate: float) -> str:
    q = statistics.quantiles(latencies, n=100)
    return f"p50 {q[49]:6.2f} ms  p99 {q[98]:6.2f} ms  {rate:8.0f}/s"


async def http_bench(base: str, count: int, concurrency: int) -> dict[str, str]:
    results = {}
    async with aiohttp.ClientSession() as session:
        ids: list[str] = []

        async def create(n: int) -> None:
            async with session.post(f"{base}/v1/runs", json={"input": f"bench {n}"}) as answer:
                assert answer.status == 202
                ids.append((await answer.json())["run_id"])

        async def poll(n: int) -> None:
            async with session.get(f"{base}/v1/runs/{ids[n % len(ids)]}") as answer:
                await answer.read()

        results["create (1 client)"] = figures(*await load(count // 4, 1, create))
        results[f"create ({concurrency} clients)"] = figures(*await load(count, concurrency, create))
        results[f"poll ({concurrency} clients)"] = figures(*await load(count, concurrency, poll))
    return results


async def fanout_broker(base: str, redis_url: str, subscribers: int) -> float:
    redis = Redis.from_url(redis_url, decode_responses=True)
    store = JobStore(redis, retention_ms=600_000)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async with session.post(f"{base}/v1/runs", json={"input": "fan-out"}) as answer:
            job_id = (await answer.json())["run_id"]
        streams = [await session.get(f"{base}/v1/runs/{job_id}/events") for _ in range(subscribers)]
        for stream in streams:
            await stream.content.readuntil(b"\n\n")  # job.queued
        snapshot = await store.load(job_id)
        assert snapshot is not None
        event = HermesEventRecorded(job_id=job_id, at_ms=1, attempt=1, hermes_run_id="run_x", name="tool.started",
                                    payload='{"event":"tool.started"}')  # fmt: skip
        started = time.perf_counter()
        await store.append(job_id, [event], fold([event], snapshot.view) or snapshot.view, expected_last_id=None)
        await asyncio.gather(*(stream.content.readuntil(b"\n\n") for stream in streams))
        elapsed = (time.perf_counter() - started) * 1000
        for stream in streams:
            stream.close()
    await redis.aclose()
    return elapsed


async def fanout_baseline(redis_url: str, subscribers: int) -> float:
    readers = [Redis.from_url(redis_url, decode_responses=True) for _ in range(subscribers)]
    writer = Redis.from_url(redis_url, decode_responses=True)
    last = await writer.xadd("bench:fanout", {"e": "0"})
    waits = [asyncio.ensure_future(r.xread({"bench:fanout": last}, block=10_000)) for r in readers]
    await asyncio.sleep(0.5)  # let every XREAD block
    started = time.perf_counter()
    await writer.xadd("bench:fanout", {"e": "1"})
    await asyncio.gather(*waits)
    elapsed = (time.perf_counter() - started) * 1000
    for client in [*readers, writer]:
        await client.aclose()
    return elapsed


async def main(args: argparse.Namespace) -> None:
    workdir = tempfile.mkdtemp(prefix="hbr-bench-")
    port = free_port()
    redis_server = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir,
         "--save", "", "--appendonly", "yes", "--appendfsync", "everysec"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    redis_url = f"redis://127.0.0.1:{port}/0"
    await asyncio.sleep(0.3)
    try:
        broker_runner, broker = await serve(create_app(Config(redis_url=redis_url), drive=False))
        baseline_runner, baseline = await serve(baseline_app(redis_url))
        ours = await http_bench(broker, args.requests, args.concurrency)
        floor = await http_bench(baseline, args.requests, args.concurrency)
        print(f"{'benchmark':28} {'broker':40} {'baseline':40}")
        for name in ours:
            print(f"{name:28} {ours[name]:40} {floor[name]:40}")
        fan = await fanout_broker(broker, redis_url, args.subscribers)
        fan_floor = await fanout_baseline(redis_url, args.subscribers)
        name = f"fan-out ({args.subscribers} subscribers)"
        ours_fan, floor_fan = f"{fan:6.1f} ms, 1 hub connection", f"{fan_floor:6.1f} ms, {args.subscribers} connections"
        print(f"{name:28} {ours_fan:40} {floor_fan:40}")
        await broker_runner.cleanup()
        await baseline_runner.cleanup()
    finally:
        redis_server.terminate()
        redis_server.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--subscribers", type=int, default=200)
    asyncio.run(main(parser.parse_args()))
