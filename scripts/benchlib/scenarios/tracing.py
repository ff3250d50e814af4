"""Row: what traces cost (SPEC S6.1). The create (c64) and end-to-end (1 replica) rounds of rows 1 and 2, with
traces exported to a local OTLP/HTTP receiver that discards them (broker column) beside the same broker with
tracing off (baseline column), alternating round by round. The cost per job is the broker's CPU time per job
(user + system, the exporter's thread included), traced minus untraced: on a shared machine it is steadier
than the rates, whose difference the notes give too.
"""

from __future__ import annotations

import statistics

import aiohttp

from benchlib.backend import SingleRedis
from benchlib.figures import Row
from benchlib.procs import Services
from benchlib.run import Plan
from benchlib.scenarios import create, e2e
from broker.store.embedded import free_port

CONCURRENCY = 64


class Traced(SingleRedis):
    """The run's redis-server, with brokers that export their traces to `endpoint`."""

    def __init__(self, base: SingleRedis, endpoint: str) -> None:
        super().__init__(base.client, base.url, "single Redis, traced")
        self.endpoint = endpoint

    @property
    def env(self) -> dict[str, str]:
        return {**super().env, "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint}


async def received(url: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/count") as answer:
        return int((await answer.json())["bytes"])


def cost_us(on: list[float], off: list[float]) -> float:
    """Microseconds per job (or request) that tracing adds at full load, from the medians of rates."""
    return (1 / statistics.median(on) - 1 / statistics.median(off)) * 1e6


async def run(services: Services, plan: Plan) -> list[Row]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    plain = SingleRedis(services.r, services.redis_url)
    traced = Traced(plain, url)
    rate = Row(f"create c{CONCURRENCY}, traces on vs off", "req/s")
    p99 = Row(f"create c{CONCURRENCY}, traces on vs off", "p99 ms")
    jobs = Row("end to end, 1 replica, traces on vs off", "jobs/s")
    exported = Row("end to end, OTLP bytes exported per job", "bytes")
    cpu = Row("end to end, broker CPU per job, traces on vs off", "µs")
    async with services.baseline("otlp_sink.py", {"PORT": str(port)}, health=f"{url}/healthz"):
        for _ in range(plan.rounds):
            for side, backend in (("broker", traced), ("baseline", plain)):
                result = await create.broker_round(services, CONCURRENCY, plan, backend)
                getattr(rate, side).append(result.rate)
                getattr(p99, side).append(result.p99_ms)
            before = await received(url)
            result_on = await e2e.broker_round(services, 1, plan.e2e_jobs, traced)
            jobs.broker.append(result_on.rate)
            cpu.broker.append(result_on.cpu_s / plan.e2e_jobs * 1e6)
            exported.broker.append((await received(url) - before) / plan.e2e_jobs)  # the broker exported at exit
            result_off = await e2e.broker_round(services, 1, plan.e2e_jobs, plain)
            jobs.baseline.append(result_off.rate)
            cpu.baseline.append(result_off.cpu_s / plan.e2e_jobs * 1e6)
    rate.note = f"tracing adds {cost_us(rate.broker, rate.baseline):.0f} µs per create at c{CONCURRENCY}"
    jobs.note = f"{plan.e2e_jobs} jobs; tracing adds {cost_us(jobs.broker, jobs.baseline):.0f} µs per job"
    exported.note = "to a local receiver that discards them"
    added = statistics.median(cpu.broker) - statistics.median(cpu.baseline)
    cpu.note = f"tracing adds {added:.0f} µs of CPU per job"
    return [rate, p99, jobs, cpu, exported]
