"""Row 7: admission (SPEC S4.1) against the simulator capped at CAP live runs. The baseline column is the ideal.

- burst: N `sleep:1` jobs created at once, on 1 and 2 replicas: makespan (first create .. last terminal) vs
  N / CAP x 1 s; refused creates (the simulator's 429 count) per accepted run vs 0; the largest distance
  between a job's finish rank and its arrival rank vs CAP (runs of one wave finish in any order).
- refusal (full mode): 1,000 jobs queued while the simulator answers every create 429 for 60 s, 2 replicas:
  Hermes creates per second during the refusal (ideal: one probe at a time, paced by the backoff), the
  replicas' CPU (utime+stime of both) over it; then how many jobs end within the drain deadline, when the last
  did, and in which order (finish vs arrival rank).
- learnt limit (full mode): the cap goes from 10 to 20 mid-run; seconds until the broker's learnt limit is 20
  (its /readyz) and until 20 of its runs are live on Hermes at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time

import aiohttp

from benchlib.figures import Row
from benchlib.load import create_body, gather_limited, post_json
from benchlib.procs import Proc, Services
from benchlib.run import TERMINAL, Plan, jobs_now, settled_jobs, sim_settled

CAP = 10
RUN_S = 1.0
SIM_STEP_S = 0.05  #: the simulator's fixed start-up pause: a `sleep:1` run lasts 1.05 s


def rank_distance(jobs: list[dict[str, object]]) -> int:
    """The largest |finish rank - arrival rank| (arrival: created_at; finish: the terminal's updated_at)."""
    arrival = sorted(range(len(jobs)), key=lambda i: float(str(jobs[i]["created_at"])))
    finish = sorted(range(len(jobs)), key=lambda i: float(str(jobs[i]["updated_at"])))
    finish_rank = {job: rank for rank, job in enumerate(finish)}
    return max((abs(finish_rank[job] - rank) for rank, job in enumerate(arrival)), default=0)


async def create_all(session: aiohttp.ClientSession, procs: list[Proc], count: int, text: str) -> list[str]:
    body = create_body(text)
    urls = [procs[n % len(procs)].url for n in range(count)]
    created = await gather_limited(count, urls, lambda url: post_json(session, f"{url}/v1/runs", body))
    return [str(job["run_id"]) for job in created]


def creates(stats: dict[str, object], status: str) -> int:
    answers = stats["creates"]
    assert isinstance(answers, dict)
    return int(answers.get(status, 0))


async def burst_round(services: Services, replicas: int, plan: Plan) -> tuple[float, float, int]:
    """(makespan s, 429s per accepted run, rank distance)."""
    await services.reset(max_concurrent=CAP)
    async with services.brokers(replicas) as procs, aiohttp.ClientSession() as session:
        ids = await create_all(session, procs, plan.admission_jobs, "bench admission sleep:1")
        await sim_settled(services, session, plan.admission_jobs, timeout_s=60 + plan.admission_jobs * 2)
        jobs = await settled_jobs(session, procs[0].url, ids, timeout_s=60)
        stats = await services.sim_stats(session)
    makespan = max(float(str(job["updated_at"])) for job in jobs) - min(float(str(job["created_at"])) for job in jobs)
    return makespan, creates(stats, "429") / max(1, creates(stats, "202")), rank_distance(jobs)


async def refusal_round(services: Services, plan: Plan) -> dict[str, float]:
    await services.reset(max_concurrent=CAP, busy=True)
    async with services.brokers(2) as procs, aiohttp.ClientSession() as session:
        ids = await create_all(session, procs, plan.refusal_jobs, "bench refusal")
        await asyncio.sleep(2)  # let the burst's first attempts land
        first, cpu = await services.sim_stats(session), sum(proc.cpu_s() for proc in procs)
        began = time.monotonic()
        await asyncio.sleep(plan.refusal_s)
        last, cpu = await services.sim_stats(session), sum(proc.cpu_s() for proc in procs) - cpu
        seconds = time.monotonic() - began
        await services.sim_settings(busy=False)
        opened = time.time()
        with contextlib.suppress(RuntimeError):  # not all within the deadline: count those that ended
            await sim_settled(services, session, plan.refusal_jobs, timeout_s=plan.drain_timeout_s)
        await asyncio.sleep(0.5)
        jobs = [job for job in await jobs_now(session, procs[0].url, ids) if job.get("status") in TERMINAL]
    completed = sum(job["status"] == "completed" for job in jobs)
    drain = max(float(str(job["updated_at"])) for job in jobs) - opened if len(jobs) == len(ids) else math.nan
    return {"creates_per_s": (creates(last, "429") - creates(first, "429")) / seconds,
            "cpu_percent": cpu / seconds * 100, "completed": completed, "drain_s": drain,
            "distance": rank_distance(jobs)}  # fmt: skip


async def learnt_round(services: Services, plan: Plan) -> tuple[float, float, int]:
    """(s from the cap's raise until the broker's learnt limit reached 20, until 20 of its runs were live on
    Hermes (NaN: not within a minute), most live runs seen on Hermes)."""
    await services.reset(max_concurrent=CAP)
    raised_cap = 2 * CAP
    async with services.brokers(1) as procs, aiohttp.ClientSession() as session:
        await create_all(session, procs, 600, "bench learnt sleep:1")
        await asyncio.sleep(4)
        await services.sim_settings(max_concurrent=raised_cap)
        raised, most = time.monotonic(), 0
        found = full = float("nan")
        while time.monotonic() - raised < 60 and math.isnan(full):  # the issue: found within a minute
            live = int(str((await services.sim_stats(session))["live"]))
            most = max(most, live)
            if live >= raised_cap:
                full = time.monotonic() - raised
            if math.isnan(found):
                async with session.get(f"{procs[0].url}/readyz") as answer:
                    limit = int((await answer.json())["admission"]["limit"])
                if limit >= raised_cap:
                    found = time.monotonic() - raised
            await asyncio.sleep(0.05)
    return found, full, most


async def run(services: Services, plan: Plan) -> list[Row]:
    ideal = plan.admission_jobs / CAP * (RUN_S + SIM_STEP_S)
    rows: list[Row] = []
    for replicas in (1, 2):
        name = f"admission, {plan.admission_jobs} x sleep:1, cap {CAP}, {replicas} replica{'s' * (replicas > 1)}"
        makespan = Row(name, "makespan s", target=f"ideal {ideal:.1f} s", ideal=ideal)
        refused = Row(name, "429s per accepted run", target="ideal 0")
        distance = Row(name, "max rank distance, finish vs arrival", target=f"ideal <= {CAP}", ideal=CAP)
        for _ in range(plan.admission_rounds):
            span, per_run, far = await burst_round(services, replicas, plan)
            makespan.broker.append(span)
            refused.broker.append(per_run)
            distance.broker.append(far)
        rows += [makespan, refused, distance]
    if plan.refusal_jobs:
        rows += await refusal_rows(services, plan)
    return rows


async def refusal_rows(services: Services, plan: Plan) -> list[Row]:
    name = f"admission, {plan.refusal_jobs} jobs held {plan.refusal_s:g} s (all 429), 2 replicas"
    figures = await refusal_round(services, plan)
    drain_ideal = plan.refusal_jobs / CAP * (SIM_STEP_S * 5)
    done = plan.refusal_jobs
    rows = [
        Row(name, "Hermes creates/s during the refusal", [figures["creates_per_s"]], target="ideal ~1 per backoff"),
        Row(name, "broker CPU % during the refusal", [figures["cpu_percent"]], target="ideal ~0"),
        Row(
            name,
            f"jobs completed within {plan.drain_timeout_s:g} s after it",
            [figures["completed"]],
            target=f"ideal {done}",
            ideal=done,
        ),
        Row(
            name,
            "s until the last ended (n/a: not all did)",
            [figures["drain_s"]],
            target=f"ideal {drain_ideal:.0f} s",
            ideal=drain_ideal,
        ),
        Row(name, "max rank distance, finish vs arrival", [figures["distance"]], target=f"ideal <= {CAP}", ideal=CAP),
    ]
    found, full, most = await learnt_round(services, plan)
    name = f"learnt limit, cap {CAP} -> {2 * CAP} mid-run, 1 replica"
    return [
        *rows,
        Row(name, f"s until the limit is {2 * CAP}", [found], target="within 60 s"),
        Row(name, f"s until {2 * CAP} runs live on Hermes", [full], target="within 60 s", note=f"most seen {most}"),
    ]
