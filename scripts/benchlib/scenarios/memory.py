"""Rows 5 and 6: idle cost and memory. No baseline: the targets stand in the baseline column.

idle: N idle SSE clients (10 per job) on one replica, following jobs held while Hermes is busy: the broker's
RSS (/proc/<pid>/status) and the Redis connections (CLIENT LIST, less the benchmark's own).
memory: Redis `used_memory` delta per queued job (Hermes busy) and per finished job (`tools:6`: 20 events,
context, board reports on to a dummy receiver answering 200), each over M jobs; and per realistic finished job
(issue 21: `deltas:1000 tools:10`, a reply of 1,000 small deltas after 10 tool calls, board on), while its
deltas are kept and after the delta window (SPEC S3.6), beside the content it carries: the text of its deltas,
its output, its reasoning text and its tool previews, as its SSE replay shows them.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson

from benchlib.figures import Row
from benchlib.load import create_body, gather_limited, post_json
from benchlib.procs import Services
from benchlib.run import Plan, get_json, settled_jobs, sim_settled, wait_until
from broker.store import keys
from broker.store.embedded import free_port

SUBSCRIBERS_PER_JOB = 10
SETTLE_S = 2.0


async def clients(services: Services) -> int:
    return len(await services.r.client_list())


async def idle_round(services: Services, plan: Plan) -> tuple[float, float, int]:
    """(RSS MB with the clients, RSS MB before them, Redis connections with the clients)."""
    await services.reset(busy=True)
    own = await clients(services)
    async with services.brokers(1) as (broker,):
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
            count = max(1, plan.idle_clients // SUBSCRIBERS_PER_JOB)
            body = create_body("bench idle")
            create = f"{broker.url}/v1/runs"
            jobs = await gather_limited(32, list(range(count)), lambda _: post_json(session, create, body))
            await asyncio.sleep(SETTLE_S)
            before = broker.rss_mb()
            attached: list[int] = [0]
            streams = [str(job["run_id"]) for job in jobs for _ in range(SUBSCRIBERS_PER_JOB)][: plan.idle_clients]
            responses: list[aiohttp.ClientResponse] = []

            async def attach(job_id: str) -> None:
                answer = await session.get(f"{broker.url}/v1/runs/{job_id}/events")
                await answer.content.readuntil(b"\n\n")  # the replayed job.queued
                responses.append(answer)
                attached[0] += 1

            try:
                await gather_limited(200, streams, attach)
                await asyncio.sleep(SETTLE_S)
                rss, connections = broker.rss_mb(), await clients(services) - own
            finally:
                for answer in responses:
                    answer.close()
    return rss, before, connections


async def queued_round(services: Services, plan: Plan) -> float:
    await services.reset(busy=True)
    async with services.brokers(1) as (broker,):
        await asyncio.sleep(SETTLE_S)
        used = int((await services.r.info("memory"))["used_memory"])
        async with aiohttp.ClientSession() as session:
            body = create_body("bench memory queued")
            create = f"{broker.url}/v1/runs"
            await gather_limited(32, list(range(plan.memory_jobs)), lambda _: post_json(session, create, body))
        await asyncio.sleep(SETTLE_S)
        after = int((await services.r.info("memory"))["used_memory"])
    return (after - used) / plan.memory_jobs / 1024


async def finished_round(services: Services, plan: Plan) -> tuple[float, int]:
    """(KB per finished job, events in one job's stream)."""
    await services.reset()
    port = free_port()
    receiver = f"http://127.0.0.1:{port}"
    async with services.baseline("receiver.py", {"PORT": str(port)}, health=f"{receiver}/count"):
        env = {"BOARD_ENABLED": "true", "BOARD_URL": f"{receiver}/"}
        async with services.brokers(1, env) as (broker,):
            await asyncio.sleep(SETTLE_S)
            used = int((await services.r.info("memory"))["used_memory"])
            async with aiohttp.ClientSession() as session:
                body = create_body("bench memory finished tools:6")
                created = await gather_limited(32, list(range(plan.memory_jobs)),
                                               lambda _: post_json(session, f"{broker.url}/v1/runs", body))  # fmt: skip
                await sim_settled(services, session, plan.memory_jobs, timeout_s=120)
                ids = [str(job["run_id"]) for job in created]
                await settled_jobs(session, broker.url, ids, timeout_s=60)
                await delivered(session, receiver)
            after = int((await services.r.info("memory"))["used_memory"])
            events = int(await services.r.xlen(keys.events(ids[0])))
    return (after - used) / plan.memory_jobs / 1024, events


REALISTIC = "bench memory realistic tools:10 deltas:1000"
CONTENT_FIELDS = ("delta", "output", "text", "preview")


async def realistic_round(services: Services, plan: Plan) -> tuple[float, float, float, dict[str, float]]:
    """(KB per realistic finished job with its deltas, KB after the delta window, KB of content per job, KB per
    job of each of its own keys after the window).

    The `used_memory` deltas also carry what Redis allocates once per server, not per job, after the baseline:
    Redis 7 keeps a latency histogram of ~27 KB per command name it has run (`latency-tracking`, freed by the
    reset's CONFIG RESETSTAT), so with few jobs they read high there; the keys' own sizes do not."""
    await services.reset()
    port = free_port()
    receiver = f"http://127.0.0.1:{port}"
    async with services.baseline("receiver.py", {"PORT": str(port)}, health=f"{receiver}/count"):
        env = {"BOARD_ENABLED": "true", "BOARD_URL": f"{receiver}/", "RUNS_DELTA_RETENTION": "600000"}
        async with services.brokers(1, env) as (broker,):
            await asyncio.sleep(SETTLE_S)
            used = int((await services.r.info("memory"))["used_memory"])
            async with aiohttp.ClientSession() as session:
                body = create_body(REALISTIC)
                created = await gather_limited(8, list(range(plan.realistic_jobs)),
                                               lambda _: post_json(session, f"{broker.url}/v1/runs", body))  # fmt: skip
                await sim_settled(services, session, plan.realistic_jobs, timeout_s=300)
                ids = [str(job["run_id"]) for job in created]
                await settled_jobs(session, broker.url, ids, timeout_s=120)
                await delivered(session, receiver)
                hot = int((await services.r.info("memory"))["used_memory"])
                content = await replayed_content(session, broker.url, ids[0])
                await window_passed(services)
            after = int((await services.r.info("memory"))["used_memory"])
            own = await per_key(services, ids)
    jobs = plan.realistic_jobs
    return (hot - used) / jobs / 1024, (after - used) / jobs / 1024, content / 1024, own


async def per_key(services: Services, job_ids: list[str]) -> dict[str, float]:
    """KB per job of each of the jobs' own keys (MEMORY USAGE)."""
    own: dict[str, float] = {}
    for name, key in (("events", keys.events), ("view", keys.view), ("board", keys.board)):
        sizes = [int(await services.r.memory_usage(key(job_id), samples=0) or 0) for job_id in job_ids]
        own[name] = sum(sizes) / len(job_ids) / 1024
    return own


async def replayed_content(session: aiohttp.ClientSession, base: str, job_id: str) -> int:
    """Bytes of text a client sees in the job's replay: deltas, output, reasoning text, tool previews."""
    total = 0
    async with session.get(f"{base}/v1/runs/{job_id}/events") as answer:
        async for line in answer.content:
            if line.startswith(b"data: "):
                document = orjson.loads(line[6:])
                total += sum(len(str(document.get(name) or "").encode()) for name in CONTENT_FIELDS)
    return total


async def window_passed(services: Services) -> None:
    """Make every scheduled delta removal due now and wait until the broker's sweep has done them all (a broker
    without delta schedules keeps its deltas: nothing to wait for)."""
    schedule = getattr(keys, "deltas", None)
    if schedule is None:
        return
    for partition in keys.partitions():
        due = await services.r.zrange(schedule(partition), 0, -1)
        if due:
            await services.r.zadd(schedule(partition), dict.fromkeys(due, 1), xx=True)

    async def swept() -> bool:
        return all([await services.r.zcard(schedule(partition)) == 0 for partition in keys.partitions()])

    await wait_until(swept, 60, "the delta sweep")
    await asyncio.sleep(SETTLE_S)


async def delivered(session: aiohttp.ClientSession, receiver: str) -> None:
    """Wait until the receiver's count stops moving for a second (every board delivery is done)."""
    last, since = -1, time.monotonic()

    async def quiet() -> bool:
        nonlocal last, since
        count = int(str((await get_json(session, f"{receiver}/count"))["received"]))
        if count != last:
            last, since = count, time.monotonic()
        return count > 0 and time.monotonic() - since > 1.0

    await wait_until(quiet, 60, "board deliveries")


async def run_idle(services: Services, plan: Plan) -> list[Row]:
    name = f"idle SSE, {plan.idle_clients} clients"
    rss = Row(name, "broker RSS MB", target="target 250 MB", ideal=250)
    connections = Row(name, "Redis connections", target="target 10", ideal=10)
    value, before, count = await idle_round(services, plan)
    rss.broker.append(value)
    connections.broker.append(count)
    rss.note = f"{before:.0f} MB before the clients; 1 replica, {SUBSCRIBERS_PER_JOB} clients per held job"
    return [rss, connections]


async def run_memory(services: Services, plan: Plan) -> list[Row]:
    queued = Row("memory per queued job", "KB", target="target 2.5 KB", ideal=2.5)
    finished = Row("memory per finished job", "KB", target="target 4 KB", ideal=4.0)
    events = 0
    for _ in range(plan.memory_rounds):
        queued.broker.append(await queued_round(services, plan))
        per_job, events = await finished_round(services, plan)
        finished.broker.append(per_job)
    queued.note = f"{plan.memory_jobs} jobs, Hermes busy"
    finished.note = f"{plan.memory_jobs} jobs, {events} events each, context, board on"
    hot = Row("memory per realistic finished job, deltas kept", "KB", target="target 100 KB", ideal=100.0)
    swept = Row("memory per realistic finished job, after the delta window", "KB", target="target 20 KB", ideal=20.0)
    content, own = 0.0, {}
    for _ in range(plan.memory_rounds):
        with_deltas, without, content, own = await realistic_round(services, plan)
        hot.broker.append(with_deltas)
        swept.broker.append(without)
    shape = f"{plan.realistic_jobs} jobs of 1,000 deltas and 10 tool calls, board on"
    hot.note = f"{shape}; content {content:.1f} KB per job (deltas, output, reasoning text, tool previews)"
    keyed = ", ".join(f"{name} {kb:.1f}" for name, kb in own.items())
    swept.note = f"{shape}; RUNS_DELTA_RETENTION passed (the deltas removed); its keys: {keyed} KB"
    return [queued, finished, hot, swept]
