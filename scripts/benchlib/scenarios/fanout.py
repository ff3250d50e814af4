"""Row 4: SSE fan-out. One run streams E deltas over S seconds (after a lead: the simulator's
`step_s`, while the subscribers attach); N SSE subscribers follow it on one replica. Lag = receive time minus
the delta's own `timestamp` (the simulator's clock, same machine), over deltas emitted after every subscriber
had its first frame; p99 over all (subscriber, delta) pairs.

Baseline: the bare relay loop (scripts/bench_baselines/relay.py) writes the same run into a stream that N
direct XREAD BLOCK readers follow, one Redis connection each.
"""

from __future__ import annotations

import asyncio
import time
from typing import cast

import aiohttp
import orjson
from redis.asyncio import Redis

from benchlib.figures import Row, percentile
from benchlib.load import create_body, post_json
from benchlib.procs import Services
from benchlib.run import Plan

STREAM = "fan:0"


def script(plan: Plan) -> str:
    return f"bench fanout deltas:{plan.fanout_events} sleep:{plan.fanout_seconds:g}"


async def sse_subscriber(session: aiohttp.ClientSession, url: str, attached: asyncio.Event, lags: list[float],
                         counter: list[int], total: int, since: list[float]) -> None:  # fmt: skip
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=None, sock_read=60)) as answer:
        first = True
        async for line in answer.content:
            if not line.startswith(b"data:"):
                continue
            now = time.time()
            if first:
                first = False
                counter[0] += 1
                if counter[0] == total:
                    since[0] = now
                    attached.set()
            event = orjson.loads(line[5:])
            if event.get("event") == "message.delta" and since[0] and event["timestamp"] > since[0]:
                lags.append((now - event["timestamp"]) * 1000)


async def broker_round(services: Services, plan: Plan) -> list[float]:
    await services.reset(step_s=plan.fanout_lead_s)
    lags: list[float] = []
    async with services.brokers(1) as (broker,):
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            job = await post_json(session, f"{broker.url}/v1/runs", create_body(script(plan), pad_to=0))
            url = f"{broker.url}/v1/runs/{job['run_id']}/events"
            attached, counter, since = asyncio.Event(), [0], [0.0]
            subscribers = [asyncio.create_task(sse_subscriber(session, url, attached, lags, counter,
                                                              plan.fanout_subscribers, since))
                           for _ in range(plan.fanout_subscribers)]  # fmt: skip
            await asyncio.wait_for(asyncio.gather(*subscribers), timeout=plan.fanout_lead_s + plan.fanout_seconds + 60)
    return lags


async def xread_reader(url: str, ready: list[int], lags: list[float], since: list[float], total: int) -> None:
    redis = Redis.from_url(url)
    try:
        await redis.ping()
        ready[0] += 1
        if ready[0] == total:
            since[0] = time.time()
        last = "0-0"
        while True:
            reply = cast(list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]],
                         await redis.xread({STREAM: last}, block=30_000, count=100))  # fmt: skip
            now = time.time()
            if not reply:
                raise RuntimeError("an XREAD reader saw no event for 30 s")
            for entry_id, fields in reply[0][1]:
                last = entry_id.decode()
                event = orjson.loads(fields[b"e"])
                if event.get("event") == "message.delta" and since[0] and event["timestamp"] > since[0]:
                    lags.append((now - event["timestamp"]) * 1000)
                if event.get("event") == "run.completed":
                    return
    finally:
        await redis.aclose()


async def baseline_round(services: Services, plan: Plan) -> list[float]:
    await services.reset(step_s=plan.fanout_lead_s)
    lags: list[float] = []
    ready, since = [0], [0.0]
    readers = [asyncio.create_task(xread_reader(services.redis_url, ready, lags, since, plan.fanout_subscribers))
               for _ in range(plan.fanout_subscribers)]  # fmt: skip
    while ready[0] < plan.fanout_subscribers:
        await asyncio.sleep(0.05)
    env = {"BENCH_RUNS": "1", "BENCH_INPUT": script(plan), "BENCH_PREFIX": "fan:"}
    async with services.baseline("relay.py", env) as proc:
        await proc.output(timeout_s=plan.fanout_lead_s + plan.fanout_seconds + 60)
        await asyncio.wait_for(asyncio.gather(*readers), timeout=30)
    return lags


async def run(services: Services, plan: Plan) -> list[Row]:
    name = f"SSE fan-out, {plan.fanout_subscribers} subscribers"
    p99, p50 = Row(name, "lag p99 ms"), Row(name, "lag p50 ms")
    p99.note = f"{plan.fanout_events} deltas in {plan.fanout_seconds:g} s; baseline: XREAD BLOCK reader per connection"
    for _ in range(plan.rounds):
        for side, measure in (("broker", broker_round), ("baseline", baseline_round)):
            lags = await measure(services, plan)
            if not lags:
                raise RuntimeError(f"{side}: no delta arrived after every subscriber attached")
            getattr(p99, side).append(percentile(lags, 99))
            getattr(p50, side).append(percentile(lags, 50))
    return [p99, p50]
