"""Row 9: the fair line (SPEC S4.2) against the simulator capped at CAP live runs, one replica, default settings.
The baseline column is the ideal.

- late key: key A creates N `sleep:1` jobs, then key B M: B's makespan (its first create .. its last terminal)
  vs the fair ideal (M jobs on half of the CAP slots: M / (CAP / 2) runs of 1.05 s) and what a FIFO line gives
  (after A's backlog); the whole run's utilisation (run-seconds / (CAP x first create .. last terminal)).
- weights: keys of weights 3 and 1, each with K jobs, created at once: the heavier key's share of the first K
  starts (both are backlogged all along; a run's start = its terminal's updated_at - its length), target 0.75.
- trickle: key A's 2K jobs, then a new one-job key for each run that starts (polling the simulator's creates), K of
  them: A's share of the creates accepted while they arrive, target 0.5 (keys without a turn are paced as one key).
- what a turn costs: key L's `sleep:2` and key S's `sleep:0.2` backlogs created at once, driven for a window with
  ADMISSION_FAIRNESS_COST=time, then with `runs`: L's share of the Hermes time of the runs started in the window (both
  still backlogged), target 0.45-0.55 under `time` (`runs` gives L about 0.9); with L of weight 3, target 0.7-0.8.
- many keys: the S4.1 burst (fill, 429s, order) with every job under its own fairness key.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import orjson

from benchlib.figures import Row
from benchlib.load import create_body, gather_limited, post_json
from benchlib.procs import Proc, Services
from benchlib.run import Plan, settled_jobs, sim_settled
from benchlib.scenarios.admission import CAP, RUN_S, SIM_STEP_S, creates, rank_distance

RUN = RUN_S + SIM_STEP_S  #: one `sleep:1` run on the simulator, s


def body(text: str, key: str, weight: float = 1.0) -> bytes:
    document = orjson.loads(create_body(text))
    document["scheduling"] = {"fairness_key": key, "fairness_weight": weight}
    return orjson.dumps(document)


async def create_keyed(
    session: aiohttp.ClientSession, proc: Proc, jobs: list[tuple[str, float]], text: str
) -> list[str]:
    """Create one job per (key, weight), 64 at a time, in order of the list (as their answers come)."""
    created = await gather_limited(
        64, jobs, lambda job: post_json(session, f"{proc.url}/v1/runs", body(text, job[0], job[1]))
    )
    return [str(job["run_id"]) for job in created]


def seconds(job: dict[str, object], name: str) -> float:
    return float(str(job[name]))


async def late_round(services: Services, plan: Plan) -> dict[str, float]:
    await services.reset(max_concurrent=CAP)
    a_count, b_count = plan.fairness_backlog, plan.fairness_late
    async with services.brokers(1) as procs, aiohttp.ClientSession() as session:
        a = await create_keyed(session, procs[0], [("A", 1.0)] * a_count, "bench fair A sleep:1")
        b = await create_keyed(session, procs[0], [("B", 1.0)] * b_count, "bench fair B sleep:1")
        await sim_settled(services, session, a_count + b_count, timeout_s=60 + (a_count + b_count) * 2)
        jobs = await settled_jobs(session, procs[0].url, a + b, timeout_s=60)
    late = jobs[a_count:]
    b_span = max(seconds(job, "updated_at") for job in late) - min(seconds(job, "created_at") for job in late)
    span = max(seconds(job, "updated_at") for job in jobs) - min(seconds(job, "created_at") for job in jobs)
    b_first = min(seconds(job, "created_at") for job in late)
    a_left = sum(seconds(job, "updated_at") - RUN > b_first for job in jobs[:a_count])  # A's not started by then
    return {
        "b_makespan": b_span,
        "fifo": (a_left + b_count) / CAP * RUN,
        "utilisation": len(jobs) * RUN / (CAP * span),
        "completed": sum(job["status"] == "completed" for job in jobs),
    }


async def weights_round(services: Services, plan: Plan) -> float:
    await services.reset(max_concurrent=CAP)
    count = plan.fairness_weighted
    mixed = [job for pair in zip([("H", 3.0)] * count, [("L", 1.0)] * count, strict=True) for job in pair]
    async with services.brokers(1) as procs, aiohttp.ClientSession() as session:
        ids = await create_keyed(session, procs[0], mixed, "bench weights sleep:1")
        await sim_settled(services, session, 2 * count, timeout_s=60 + count * 2)
        jobs = await settled_jobs(session, procs[0].url, ids, timeout_s=60)
    heavy = set(ids[0::2])
    started = sorted(jobs, key=lambda job: seconds(job, "updated_at"))[:count]
    return sum(str(job["run_id"]) in heavy for job in started) / count


async def trickle_round(services: Services, plan: Plan) -> float:
    await services.reset(max_concurrent=CAP)
    count = plan.fairness_weighted
    async with services.brokers(1) as procs, aiohttp.ClientSession() as session:
        a = set(await create_keyed(session, procs[0], [("A", 1.0)] * (2 * count), "bench trickle A sleep:1"))
        new: list[str] = []
        first, seen, deadline = None, 0, time.monotonic() + 60 + count * 2
        while len(new) < count:  # one new key per run seen starting
            assert time.monotonic() < deadline, "runs stopped starting"
            started = await accepted(services, session)
            if len(started) > seen:
                fresh = [(f"new-{len(new) + i}", 1.0) for i in range(min(len(started) - seen, count - len(new)))]
                first = len(started) if first is None else first
                new += await create_keyed(session, procs[0], fresh, "bench trickle new sleep:1")
                seen = len(started)
            else:
                await asyncio.sleep(0.02)
        meanwhile = (await accepted(services, session))[first:seen]
        await sim_settled(services, session, 3 * count, timeout_s=60 + count * 6)
    return sum(job in a for job in meanwhile) / max(1, len(meanwhile))


LONG_S, SHORT_S = 2.0, 0.2  #: the run lengths of the cost row's two keys


async def cost_round(services: Services, plan: Plan, mode: str, long_weight: float = 1.0) -> float:
    """L's share (of weight `long_weight`, S's 1) of the Hermes time of the runs started in a window of
    `plan.fairness_weighted / 4` s."""
    await services.reset(max_concurrent=CAP)
    window_s = plan.fairness_weighted / 4
    longs = int(CAP * window_s / (LONG_S + SIM_STEP_S)) + CAP
    shorts = int(CAP * window_s / (SHORT_S + SIM_STEP_S)) + CAP
    extra = {"ADMISSION_FAIRNESS_COST": mode, "ADMISSION_FAIRNESS_GUESS": "1000"}
    async with services.brokers(1, extra) as procs, aiohttp.ClientSession() as session:
        url = procs[0].url
        mixed = [("L", long_weight)] * longs + [("S", 1.0)] * shorts
        text = {"L": f"bench cost L sleep:{LONG_S}", "S": f"bench cost S sleep:{SHORT_S}"}
        created = await gather_limited(
            64, mixed, lambda job: post_json(session, f"{url}/v1/runs", body(text[job[0]], job[0], job[1]))
        )
        ids = [str(job["run_id"]) for job in created]
        long_ids = set(ids[:longs])
        began = None
        while began is None:  # the window opens at the first run
            began = time.monotonic() if await accepted(services, session) else None
            await asyncio.sleep(0.02)
        await asyncio.sleep(window_s)
        started = await accepted(services, session)
        await gather_limited(64, ids, lambda job_id: stop(session, f"{url}/v1/runs/{job_id}/stop"))
    long_n = sum(job in long_ids for job in started)
    long_time, short_time = long_n * (LONG_S + SIM_STEP_S), (len(started) - long_n) * (SHORT_S + SIM_STEP_S)
    return long_time / max(1e-9, long_time + short_time)


async def stop(session: aiohttp.ClientSession, url: str) -> int:
    """Stop a job, whatever it is by now (a finished one answers 409)."""
    async with session.post(url) as answer:
        return answer.status


async def accepted(services: Services, session: aiohttp.ClientSession) -> list[str]:
    """The jobs whose creates the simulator accepted, in order."""
    async with session.get(f"{services.sim_url}/_sim/requests") as answer:
        requests = (await answer.json())["requests"]
    return [
        str(r["idempotency_key"]).split("#")[0]
        for r in requests
        if r["method"] == "POST" and r["path"] == "/v1/runs" and r["status"] == 202
    ]


async def many_keys_round(services: Services, plan: Plan) -> tuple[float, float, int]:
    await services.reset(max_concurrent=CAP)
    count = plan.admission_jobs
    async with services.brokers(1) as procs, aiohttp.ClientSession() as session:
        ids = await create_keyed(session, procs[0], [(f"key-{n:04d}", 1.0) for n in range(count)], "bench keys sleep:1")
        await sim_settled(services, session, count, timeout_s=60 + count * 2)
        jobs = await settled_jobs(session, procs[0].url, ids, timeout_s=60)
        stats = await services.sim_stats(session)
    span = max(seconds(job, "updated_at") for job in jobs) - min(seconds(job, "created_at") for job in jobs)
    return span, creates(stats, "429") / max(1, creates(stats, "202")), rank_distance(jobs)


async def run(services: Services, plan: Plan) -> list[Row]:
    a_count, b_count = plan.fairness_backlog, plan.fairness_late
    ideal = b_count / (CAP / 2) * RUN
    name = f"fairness, key A {a_count} then key B {b_count} x sleep:1, cap {CAP}, 1 replica"
    figures = await late_round(services, plan)
    rows = [
        Row(
            name,
            "B's makespan s",
            [figures["b_makespan"]],
            target=f"fair ideal {ideal:.1f} s (<= {1.5 * ideal:.1f}); FIFO {figures['fifo']:.0f} s",
            ideal=ideal,
        ),
        Row(name, "utilisation of the cap", [figures["utilisation"]], target=">= 0.9", ideal=1.0),
        Row(name, "jobs completed", [figures["completed"]], target=f"{a_count + b_count}", ideal=a_count + b_count),
    ]
    count = plan.fairness_weighted
    name = f"fairness, weights 3:1, {count} + {count} x sleep:1, cap {CAP}, 1 replica"
    share = await weights_round(services, plan)
    rows.append(Row(name, f"heavier key's share of the first {count} starts", [share], target="0.7-0.8", ideal=0.75))
    name = f"fairness, key A {2 * count} then a new key per start, {count} x sleep:1, cap {CAP}, 1 replica"
    trickle = await trickle_round(services, plan)
    rows.append(Row(name, "A's share of the starts meanwhile", [trickle], target="ideal 0.5 (>= 0.35)", ideal=0.5))
    name = f"fairness, key L sleep:{LONG_S} and key S sleep:{SHORT_S} backlogs, cap {CAP}, 1 replica"
    for mode, target in (("time", "0.45-0.55"), ("runs", "about 0.9 (counting jobs)")):
        share = await cost_round(services, plan, mode)
        rows.append(Row(name, f"L's share of the Hermes time, ADMISSION_FAIRNESS_COST={mode}", [share], target=target))
    share = await cost_round(services, plan, "time", long_weight=3.0)
    metric = "L's share of the Hermes time, L of weight 3, ADMISSION_FAIRNESS_COST=time"
    rows.append(Row(name, metric, [share], target="0.7-0.8", ideal=0.75))
    span, per_run, far = await many_keys_round(services, plan)
    name = f"fairness, {plan.admission_jobs} x sleep:1, one key each, cap {CAP}, 1 replica"
    burst_ideal = plan.admission_jobs / CAP * RUN
    return [
        *rows,
        Row(name, "makespan s", [span], target=f"ideal {burst_ideal:.1f} s", ideal=burst_ideal),
        Row(name, "429s per accepted run", [per_run], target="ideal 0"),
        Row(name, "max rank distance, finish vs arrival", [far], target=f"ideal <= {CAP}", ideal=CAP),
    ]
