"""Row: several Hermes deployments (SPEC S10). Three simulators capped at 4, 6 and 10 behind one broker (one line):
N `sleep:1` jobs created at once. Makespan vs the ideal N / 20 x 1 s (the issue: <= 1.15 x), refused creates per
accepted run (<= 0.1), and each simulator's peak of live runs vs its cap. (The sessions' affinity and the killed
simulator of the issue's measure are covered by tests, not measured here yet.)
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator

import aiohttp
import orjson

from benchlib.figures import Row
from benchlib.load import gather_limited, post_json
from benchlib.procs import Proc, Services, free_port, wait_http
from benchlib.run import Plan, settled_jobs, wait_until
from benchlib.scenarios.admission import RUN_S, SIM_STEP_S

CAPS = (4, 6, 10)


@contextlib.asynccontextmanager
async def simulators(services: Services) -> AsyncIterator[list[str]]:
    """The run's simulator (capped at 4) and two more (6, 10), each reset; their URLs in that order."""
    await services.reset(max_concurrent=CAPS[0])
    procs: list[Proc] = []
    try:
        urls = [services.sim_url]
        for cap in CAPS[1:]:
            port = free_port()
            argv = [sys.executable, "-m", "broker.simulator", "--port", str(port), "--max-concurrent", str(cap)]
            procs.append(services.stack.spawn("simulator", argv))
            urls.append(f"http://127.0.0.1:{port}")
            await wait_http(f"{urls[-1]}/health", 20, "simulator", procs[-1])
        async with aiohttp.ClientSession() as session:
            for url in urls[1:]:
                async with session.post(f"{url}/_sim/settings", json={"step_s": SIM_STEP_S}) as answer:
                    answer.raise_for_status()
        yield urls
    finally:
        for proc in procs:
            services.stack.stop(proc)


async def stats(session: aiohttp.ClientSession, url: str) -> dict[str, object]:
    async with session.get(f"{url}/_sim/stats") as answer:
        found: dict[str, object] = await answer.json()
        return found


def count(stats_of: dict[str, object], status: str) -> int:
    answers = stats_of["creates"]
    assert isinstance(answers, dict)
    return int(answers.get(status, 0))


async def burst_round(services: Services, jobs: int) -> tuple[float, float, list[int]]:
    """(makespan s, 429s per accepted run, each simulator's peak of live runs)."""
    async with simulators(services) as urls:
        extra = {"HERMES_URL": ",".join(urls), "HERMES_MAX_CONCURRENT": "0"}
        async with services.brokers(1, extra) as procs, aiohttp.ClientSession() as session:
            body = orjson.dumps({"input": "bench upstreams sleep:1"})  # no session: nothing binds a job (S10)
            urls_of = [procs[0].url] * jobs
            created = await gather_limited(jobs, urls_of, lambda url: post_json(session, f"{url}/v1/runs", body))
            ids = [str(job["run_id"]) for job in created]

            async def settled() -> bool:
                found = [await stats(session, url) for url in urls]
                return sum(int(str(one["settled"])) for one in found) >= jobs

            await wait_until(settled, 60 + jobs, f"{jobs} runs settled on the simulators")
            done = await settled_jobs(session, procs[0].url, ids, timeout_s=60)
            figures = [await stats(session, url) for url in urls]
    makespan = max(float(str(job["updated_at"])) for job in done) - min(float(str(job["created_at"])) for job in done)
    refused = sum(count(f, "429") for f in figures) / max(1, sum(count(f, "202") for f in figures))
    return makespan, refused, [int(str(f["peak_live"])) for f in figures]


async def run(services: Services, plan: Plan) -> list[Row]:
    jobs = 40 if plan.quick else 400
    ideal = jobs / sum(CAPS) * (RUN_S + SIM_STEP_S)
    name = f"upstreams, {jobs} x sleep:1, caps {'/'.join(map(str, CAPS))}, learnt, 1 replica"
    makespan = Row(name, "makespan s", target=f"ideal {ideal:.1f} s (<= 1.15 x)", ideal=ideal)
    refused = Row(name, "429s per accepted run", target="<= 0.1")
    peaks = [Row(name, f"peak live runs on the simulator capped at {cap}", target=f"<= {cap}") for cap in CAPS]
    for _ in range(1 if plan.quick else 2):
        span, per_run, peak = await burst_round(services, jobs)
        makespan.broker.append(span)
        refused.broker.append(per_run)
        for row, value in zip(peaks, peak, strict=True):
            row.broker.append(value)
    return [makespan, refused, *peaks]
