"""Row 2: end to end. N jobs (default reply: 4 deltas + reasoning + completed, 8 stored events a job) created
32 at a time with no think time; jobs/s from the first create to the last terminal, on 1 and 2 replicas.

Completion costs the broker nothing while the clock runs: the benchmark polls the simulator's `/_sim/stats`
until it settled N runs, then reads every job once (GET) and takes the last terminal as the largest
`updated_at`. Baseline: an arq worker (scripts/bench_baselines/arq_worker.py) whose job creates the run and
reads its stream; the enqueuer enqueues the same N jobs 32 at a time and waits for every result.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from dataclasses import dataclass

import aiohttp

from benchlib.arqenv import arq_python
from benchlib.backend import Backend, SingleRedis
from benchlib.figures import Row
from benchlib.load import create_body, gather_limited, post_json
from benchlib.procs import BASELINES, Services
from benchlib.run import Plan, redis_calls, settled_jobs, sim_settled
from broker.store import keys

CREATORS = 32
STEP_S = 0.01  #: the simulator's pause between deltas: 50 ms a job, so Hermes is never what limits


@dataclass
class E2EResult:
    rate: float  #: jobs/s, first create to last terminal
    calls: list[int]  #: Redis commands while the jobs ran, master by master
    jobs: int
    events: int  #: events in the first job's stream
    cpu_s: float = 0.0  #: the brokers' CPU time (user + system) from the first create to the last terminal

    @property
    def calls_per_job(self) -> float:
        return sum(self.calls) / self.jobs


async def broker_round(services: Services, replicas: int, jobs: int, backend: Backend | None = None) -> E2EResult:
    """`jobs` jobs end to end through `replicas` brokers on `backend` (default: the run's redis-server)."""
    store = backend or SingleRedis(services.r, services.redis_url)
    await store.flush()
    await services.reset_sim(step_s=STEP_S)
    async with services.brokers(replicas, store.env) as procs:
        urls = itertools.cycle([proc.url for proc in procs])
        body = create_body("bench end to end")
        await store.reset_stats()
        cpu_before = sum(proc.cpu_s() for proc in procs)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            targets = [next(urls) for _ in range(jobs)]
            started = time.time()
            created = await gather_limited(CREATORS, targets, lambda url: post_json(session, f"{url}/v1/runs", body))
            await sim_settled(services, session, jobs, timeout_s=60 + jobs / 5)
            await asyncio.sleep(0.2)  # the terminal append follows the simulator's last event
            calls = await store.commands()
            cpu_s = sum(proc.cpu_s() for proc in procs) - cpu_before
            ids = [str(job["run_id"]) for job in created]
            finished = await settled_jobs(session, procs[0].url, ids, timeout_s=60)
        end = max(float(str(job["updated_at"])) for job in finished)
        events = await store.xlen(keys.events(ids[0]))
    bad = [job["status"] for job in finished if job["status"] != "completed"]
    if bad:
        raise RuntimeError(f"{len(bad)} jobs did not complete: {bad[:3]}")
    return E2EResult(jobs / (end - started), calls, jobs, events, cpu_s)


async def arq_round(services: Services, jobs: int) -> tuple[float, float]:
    """(jobs/s, Redis commands per job) of the arq worker; arq runs in its own virtualenv (benchlib.arqenv)."""
    python = arq_python()
    await services.reset(step_s=STEP_S)
    async with services.baseline("arq_worker.py", python=python):
        enqueuer = await asyncio.create_subprocess_exec(
            python, str(BASELINES / "arq_enqueue.py"), str(jobs), str(CREATORS),
            env={**os.environ, "BENCH_REDIS_URL": services.redis_url}, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await enqueuer.communicate()
    if enqueuer.returncode != 0:
        raise RuntimeError(f"the arq enqueuer failed ({enqueuer.returncode})")
    report = json.loads(out.decode().strip().splitlines()[-1])
    end = max(float(result["finished"]) for result in report["results"])
    return jobs / (end - float(report["started"])), redis_calls(report["commandstats"]) / jobs


async def run(services: Services, plan: Plan) -> list[Row]:
    one = Row("end to end, 1 replica", "jobs/s")
    two = Row("end to end, 2 replicas", "jobs/s")
    commands = Row("end to end, Redis commands per job", "commands")
    events = 0
    for _ in range(plan.rounds):  # one arq sample beside both broker figures of a round
        result = await broker_round(services, 1, plan.e2e_jobs)
        one.broker.append(result.rate)
        commands.broker.append(result.calls_per_job)
        events = result.events
        arq_rate, arq_calls = await arq_round(services, plan.e2e_jobs)
        one.baseline.append(arq_rate)
        two.baseline.append(arq_rate)
        commands.baseline.append(arq_calls)
        two.broker.append((await broker_round(services, 2, plan.e2e_jobs)).rate)
    one.note = f"{plan.e2e_jobs} jobs, {events} events/job; baseline: arq worker"
    two.note = "baseline: arq worker (one process)"
    commands.note = "1 replica; baseline: arq worker + enqueuer, result polling included"
    return [one, two, commands]
