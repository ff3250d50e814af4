"""Row 1: POST /v1/runs (a ~724 B body with context, a fresh Idempotency-Key each) at c8 and c64, Hermes busy.

Broker and ceiling (scripts/bench_baselines/ceiling.py) alternate round by round, each round on an empty Redis
and a freshly started broker, so the jobs of earlier rounds never weigh on later ones.
"""

from __future__ import annotations

import secrets

from benchlib.backend import Backend, SingleRedis
from benchlib.figures import Row
from benchlib.load import LoadResult, have_wrk, python_creates, wrk_creates
from benchlib.procs import Services
from benchlib.run import Plan
from broker.store.embedded import free_port


async def measure(services: Services, url: str, concurrency: int, seconds: float) -> LoadResult:
    prefix = secrets.token_hex(4)
    if have_wrk():
        return await wrk_creates(url, concurrency, seconds, prefix, services.stack.workdir)
    return await python_creates(url, concurrency, seconds, prefix)


async def broker_round(services: Services, concurrency: int, plan: Plan, backend: Backend | None = None,
                       ) -> LoadResult:  # fmt: skip
    """One broker on `backend` (default: the run's redis-server): a warm-up, then the measured load."""
    store = backend or SingleRedis(services.r, services.redis_url)
    await store.flush()
    await services.reset_sim(busy=True)
    async with services.brokers(1, store.env) as (broker,):
        await measure(services, broker.url, concurrency, plan.warmup_s)
        return await measure(services, broker.url, concurrency, plan.load_s)


async def ceiling_round(services: Services, concurrency: int, plan: Plan) -> LoadResult:
    await services.reset(busy=True)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with services.baseline("ceiling.py", {"PORT": str(port)}, health=f"{url}/healthz"):
        await measure(services, url, concurrency, plan.warmup_s)
        return await measure(services, url, concurrency, plan.load_s)


async def run(services: Services, plan: Plan) -> list[Row]:
    rows: list[Row] = []
    for concurrency in (8, 64):
        name = f"create c{concurrency}"
        rate, p50, p99 = Row(name, "req/s"), Row(name, "p50 ms"), Row(name, "p99 ms")
        failed = 0
        tool = ""
        for _ in range(plan.rounds):
            for side, measure_round in (("broker", broker_round), ("baseline", ceiling_round)):
                result = await measure_round(services, concurrency, plan)
                failed += result.failed if side == "broker" else 0
                tool = result.tool
                for row, value in ((rate, result.rate), (p50, result.p50_ms), (p99, result.p99_ms)):
                    getattr(row, side).append(value)
        rate.note = f"{tool}, {plan.load_s:g} s per round" + (f", {failed} non-2xx from the broker" if failed else "")
        rows += [rate, p50, p99]
    return rows
