"""The quotas row (SPEC S4.4) against the simulator capped at QUOTA_CAP live runs. The baseline column is the target.

- live: two replicas; key A with `live: 3` and N `sleep:1` jobs, key B unlimited with N, created at once. A's peak
  of live runs is read off the simulator's own runs (created .. last update), and the cap's utilisation while B has
  work (run-seconds inside [first create, B's last end] / (cap x that span)).
- budget: one replica; a key with 10,000 tokens per hour and runs of 1,000 tokens (`tokens:1000 sleep:0.5`), more
  jobs than the budget allows. The tokens its settled runs used, against the budget plus what its runs live when
  the budget was crossed used (the run that crossed it settling, the others still live).
"""

from __future__ import annotations

import asyncio

import aiohttp
import orjson

from benchlib.figures import Row
from benchlib.load import create_body, gather_limited, post_json
from benchlib.procs import Proc, Services
from benchlib.run import Plan, get_json, settled_jobs, sim_settled, wait_until

QUOTA_CAP = 20
LIVE_QUOTA = 3
BUDGET = 10_000
RUN_TOKENS = 1_000


def body(text: str, key: str) -> bytes:
    document = orjson.loads(create_body(text))
    document["scheduling"] = {"fairness_key": key}
    return orjson.dumps(document)


async def create(session: aiohttp.ClientSession, proc: Proc, keys: list[str], text: str) -> list[str]:
    created = await gather_limited(64, keys, lambda key: post_json(session, f"{proc.url}/v1/runs", body(text, key)))
    return [str(job["run_id"]) for job in created]


Jobs = list[dict[str, object]]


async def runs(services: Services, session: aiohttp.ClientSession, jobs: Jobs) -> list[tuple[float, float]]:
    """(created, last update) of each job's Hermes run, as the simulator knows it."""
    url = f"{services.sim_url}/v1/runs/"
    found = await asyncio.gather(*(get_json(session, f"{url}{job['hermes_run_id']}") for job in jobs))
    return [(float(str(run["created_at"])), float(str(run["updated_at"]))) for run in found]


def peak(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    live = top = 0
    for _, step in edges:  # an end before a start at the same instant
        live += step
        top = max(top, live)
    return top


async def live_round(services: Services, plan: Plan) -> tuple[int, float, int]:
    await services.reset(max_concurrent=QUOTA_CAP)
    quotas = orjson.dumps({"keys": {"A": {"live": LIVE_QUOTA}}}).decode()
    count = plan.quota_jobs
    async with services.brokers(2, {"ADMISSION_QUOTAS": quotas}) as procs, aiohttp.ClientSession() as session:
        a = await create(session, procs[0], ["A"] * count, "bench quota A sleep:1")
        b = await create(session, procs[1], ["B"] * count, "bench quota B sleep:1")
        await sim_settled(services, session, 2 * count, timeout_s=60 + count * 2)
        jobs = await settled_jobs(session, procs[0].url, a + b, timeout_s=60)
        a_runs = await runs(services, session, jobs[:count])
        b_runs = await runs(services, session, jobs[count:])
    begin = min(float(str(job["created_at"])) for job in jobs)
    end = max(stop for _, stop in b_runs)
    busy = sum(max(0.0, min(stop, end) - max(start, begin)) for start, stop in a_runs + b_runs)
    completed = sum(job["status"] == "completed" for job in jobs)
    return peak(a_runs), busy / (QUOTA_CAP * (end - begin)), completed


async def budget_round(services: Services, plan: Plan) -> tuple[int, int]:
    await services.reset(max_concurrent=QUOTA_CAP)
    quotas = orjson.dumps({"keys": {"T": {"tokens": BUDGET, "window": "1h"}}}).decode()
    count = plan.budget_jobs
    async with services.brokers(1, {"ADMISSION_QUOTAS": quotas}) as procs, aiohttp.ClientSession() as session:
        ids = await create(session, procs[0], ["T"] * count, f"bench budget tokens:{RUN_TOKENS} sleep:0.5")

        async def settled_or_held() -> bool:
            shown = [await get_json(session, f"{procs[0].url}/v1/runs/{job_id}") for job_id in ids]
            return all(
                job["status"] == "completed" or (isinstance(job["hold"], dict) and job["hold"]["reason"] == "budget")
                for job in shown
            )

        await wait_until(settled_or_held, 60 + count, "every job settled or held by the budget", every_s=0.5)
        shown = [await get_json(session, f"{procs[0].url}/v1/runs/{job_id}") for job_id in ids]
        done = [job for job in shown if job["status"] == "completed"]
        intervals = sorted(await runs(services, session, done), key=lambda run: run[1])
    used = len(done) * RUN_TOKENS
    crossing = intervals[BUDGET // RUN_TOKENS - 1][1] if len(intervals) >= BUDGET // RUN_TOKENS else float("inf")
    live = sum(1 for start, stop in intervals if start <= crossing < stop)
    return used, BUDGET + live * RUN_TOKENS


async def run(services: Services, plan: Plan) -> list[Row]:
    count = plan.quota_jobs
    name = f"quotas, key A live {LIVE_QUOTA} + key B, {count} + {count} x sleep:1, cap {QUOTA_CAP}, 2 replicas"
    top, utilisation, completed = await live_round(services, plan)
    rows = [
        Row(name, "A's peak live runs (simulator)", [top], target=f"= {LIVE_QUOTA}", ideal=LIVE_QUOTA),
        Row(name, "utilisation of the cap while B has work", [utilisation], target=">= 0.9", ideal=1.0),
        Row(name, "jobs completed", [completed], target=f"{2 * count}", ideal=2 * count),
    ]
    used, bound = await budget_round(services, plan)
    name = f"quotas, {BUDGET} tokens per 1h, {plan.budget_jobs} runs of {RUN_TOKENS}, cap {QUOTA_CAP}, 1 replica"
    rows.append(Row(name, "tokens its settled runs used", [used], target=f"<= {bound} (budget + live at the crossing)"))
    return rows
