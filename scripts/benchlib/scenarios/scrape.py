"""Row scrape: what observing the line costs Redis at many waiting keys, and the largest Redis call of a delta removal.

- `/readyz` latency at N waiting jobs of N fairness keys (SPEC S4.2: at 100,000 of 100,000 within 50 ms), one broker
  replica (Hermes busy: the jobs stay waiting), against the previous main's read of the same figures from this
  process (its one pipeline: six ZCOUNTs, the fair hash's HGETALL and the oldest queued job per partition, then a
  ZCARD per due schedule; no HTTP, so the baseline is kind to itself).
- Redis commands of one fresh read of those figures (INFO commandstats, the scripts' own commands included), this
  version's against the previous main's, in this process with no broker running.
- The largest Redis call (SLOWLOG) removing the deltas of one finished job of M entries (nine in ten deltas): this
  version's slices against the previous main's one-call script (tests/integration/store/previous/).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
from redis.asyncio import Redis

from benchlib.figures import Row
from benchlib.procs import Services
from benchlib.run import Plan
from broker.admission import fair
from broker.admission.pacing import Pacing
from broker.events import JobCreated, JobStatus, Scheduling
from broker.store import keys
from broker.store.admission import AdmissionStore
from broker.store.deltas import DeltaSchedule
from broker.store.jobs import JobStore
from projections.job import apply

PREVIOUS = Path(__file__).resolve().parents[3] / "tests" / "integration" / "store" / "previous" / "remove_deltas.lua"
READS = 20  #: /readyz requests per round
SETTLE_S = 5.0
SEED_BATCH = 32  #: creates at once (the benchmark's client has a small pool)


async def _seed(redis: Redis, count: int) -> None:
    store = JobStore(redis, retention_ms=86_400_000)

    async def create(i: int) -> None:
        event = JobCreated(
            job_id=f"job_{i:032x}", at_ms=1_000, body="{}", fingerprint="f", scheduling=Scheduling(fairness_key=f"k{i}")
        )
        view = apply(None, event)
        assert view is not None
        await store.create(event, view)

    for start in range(0, count, SEED_BATCH):
        await asyncio.gather(*(create(i) for i in range(start, min(count, start + SEED_BATCH))))


async def _previous_read(redis: Redis) -> None:
    """The previous main's read of the line's figures (broker/store/line_state.py and store/work.py there)."""
    bands = [(fair.front(p), f"({fair.front(p + 1)}" if p < fair.PRIORITIES[-1] else "+inf") for p in fair.PRIORITIES]
    async with redis.pipeline(transaction=False) as pipe:
        pipe.hgetall(keys.ADMISSION_STATE)
        pipe.zcount(keys.ADMISSION_LIVE, "(0", "+inf")
        for partition in keys.partitions():
            pipe.zcount(keys.line(partition), "-inf", f"({fair.BASE}")
            for low, high in bands:
                pipe.zcount(keys.line(partition), low, high)
            pipe.hgetall(keys.fair(partition))
            pipe.execute_command("ZRANGE", keys.runs_index(partition, JobStatus.QUEUED.value), 0, 0, "WITHSCORES")
        await pipe.execute()
    async with redis.pipeline(transaction=False) as pipe:
        for partition in keys.partitions():
            pipe.zcard(keys.due(partition))
        await pipe.execute()


async def _commands(redis: Redis, read: object) -> int:
    """Commands Redis ran for `read` (a coroutine): INFO commandstats before and after, less the INFO itself."""

    def total(stats: dict[str, dict[str, int]]) -> int:
        return sum(int(v["calls"]) for v in stats.values())

    before = total(await redis.info("commandstats"))
    await read  # type: ignore[misc]
    return total(await redis.info("commandstats")) - before - 1


async def _largest_call_ms(redis: Redis, remove: object) -> float:
    await redis.config_set("slowlog-log-slower-than", 0)
    await redis.config_set("slowlog-max-len", 10_000)
    await redis.slowlog_reset()
    await remove  # type: ignore[misc]
    log = await redis.slowlog_get(10_000)
    await redis.config_set("slowlog-log-slower-than", 10_000)
    return max(int(entry["duration"]) for entry in log if "EVAL" in str(entry["command"])[:12].upper()) / 1000


async def _delta_job(redis: Redis, job_id: str, entries: int) -> None:
    events = keys.events(job_id)
    await redis.xadd(events, {"e": '{"type":"JobCreated"}'})
    for start in range(0, entries - 2, 5_000):
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(start, min(start + 5_000, entries - 2)):
                pipe.xadd(events, {"e": '[1,"tool.started",{}]' if i % 10 == 0 else '[1,1,"word "]'})
            await pipe.execute()
    await redis.xadd(events, {"e": '{"type":"JobFinished","output":"out"}'})
    await redis.hset(keys.view(job_id), mapping={"state": '{"output":"out"}', "last_id": "0-1"})  # type: ignore[misc]
    await redis.zadd(keys.deltas(keys.partition_of(job_id)), {job_id: 1})


async def _readyz_ms(services: Services, plan: Plan) -> tuple[list[float], list[float]]:
    broker_ms: list[float] = []
    previous_ms: list[float] = []
    async with services.brokers(1) as (broker,), aiohttp.ClientSession() as session:
        await asyncio.sleep(SETTLE_S)  # its start-up work done (the walk over the keys' sorted sets)
        for _ in range(plan.rounds):
            for _ in range(READS):
                began = time.perf_counter()
                async with session.get(f"{broker.url}/readyz") as answer:
                    await answer.read()
                broker_ms.append((time.perf_counter() - began) * 1000)
                began = time.perf_counter()
                await _previous_read(services.r)
                previous_ms.append((time.perf_counter() - began) * 1000)
    return broker_ms, previous_ms


async def run(services: Services, plan: Plan) -> list[Row]:
    n = plan.scrape_keys
    await services.reset(busy=True)
    await _seed(services.r, n)
    store = AdmissionStore(services.r, Pacing())
    await store.state(0)  # the scripts loaded
    commands = Row(f"scrape: Redis commands of one read of /readyz's figures, {n:,} waiting keys", "commands")
    commands.broker.append(await _commands(services.r, store.state(0)))
    commands.baseline.append(await _commands(services.r, _previous_read(services.r)))
    commands.note = "baseline: the previous main's read; scripts' own commands counted"
    broker_ms, previous_ms = await _readyz_ms(services, plan)
    readyz = Row(f"scrape: GET /readyz, {n:,} waiting jobs of {n:,} keys", "ms", broker_ms, previous_ms)
    readyz.note = "baseline: the previous main's Redis read alone (no HTTP); SPEC target 50 ms"
    deltas = Row(f"scrape: largest Redis call removing a {plan.scrape_entries:,}-entry job's deltas", "ms (SLOWLOG)")
    previous = PREVIOUS.read_text()
    for _ in range(plan.rounds):
        await services.reset()
        job = "job_" + "d" * 32
        await _delta_job(services.r, job, plan.scrape_entries)
        deltas.broker.append(await _largest_call_ms(services.r, DeltaSchedule(services.r).remove([job], 10)))
        await services.reset()
        await _delta_job(services.r, job, plan.scrape_entries)
        partition = keys.partition_of(job)
        call = services.r.eval(
            previous,
            4,
            keys.events(job),
            keys.view(job),
            keys.deltas(partition),
            keys.scratch(partition),
            job,
            10,
            "",
            "",
        )  # type: ignore[misc]
        deltas.baseline.append(await _largest_call_ms(services.r, call))
    deltas.note = "baseline: the previous main's remove_deltas.lua (one call)"
    return [commands, readyz, deltas]
