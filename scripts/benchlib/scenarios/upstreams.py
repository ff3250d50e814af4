"""Row: several Hermes deployments (SPEC S10, issue 20). Three simulators capped at 4, 6 and 10 behind one broker
(one line), default broker settings (learnt limits), in three rounds:

- burst: N `sleep:1` jobs created at once. Makespan vs the ideal N / 20 x 1 s (the issue: <= 1.15 x), refused
  creates per accepted run (<= 0.1), and each simulator's peak of live runs vs its cap;
- sessions (upstreams_sessions.py): S sessions x 4 sequential turns, every turn on its session's upstream;
- kill (upstreams_kill.py): the simulator capped at 6 SIGKILLed mid-run and started again later (20 s; 3 s with
  --quick): every job completes and no attempt key runs twice.
"""

from __future__ import annotations

import aiohttp
import orjson

from benchlib.figures import Row
from benchlib.load import gather_limited, post_json
from benchlib.procs import Services
from benchlib.run import Plan, settled_jobs, wait_until
from benchlib.scenarios.admission import RUN_S, SIM_STEP_S
from benchlib.scenarios.upstreams_fleet import CAPS, count, simulators, stats
from benchlib.scenarios.upstreams_kill import kill_round
from benchlib.scenarios.upstreams_sessions import TURNS, sessions_round


async def burst_round(services: Services, jobs: int) -> tuple[float, float, list[int]]:
    """(makespan s, 429s per accepted run, each simulator's peak of live runs)."""
    async with simulators(services) as fleet:
        urls = fleet.urls
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
    return [*await burst_rows(services, plan), *await sessions_rows(services, plan), *await kill_rows(services, plan)]


async def burst_rows(services: Services, plan: Plan) -> list[Row]:
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


async def sessions_rows(services: Services, plan: Plan) -> list[Row]:
    sessions = 6 if plan.quick else 50
    found = await sessions_round(services, sessions)
    turns = sessions * TURNS
    name = f"upstreams, {sessions} sessions x {TURNS} turns (sleep:0.2), caps {'/'.join(map(str, CAPS))}"
    note = f"sessions per upstream {found.spread}"
    on_own = f"= {turns}/{turns}"
    rows = [Row(name, "makespan s", [found.makespan_s], target="-", note=note),
            Row(name, "turns on their session's upstream (job object)", [found.by_job_object], target=on_own,
                ideal=turns),
            Row(name, "turns on their session's upstream (simulators' logs)", [found.by_simulators], target=on_own,
                ideal=turns)]  # fmt: skip
    if found.by_job_object != turns or found.by_simulators != turns:
        raise RuntimeError(f"turns on their session's upstream: {found.by_job_object}/{turns} by the job objects, "
                           f"{found.by_simulators}/{turns} by the simulators ({note})")  # fmt: skip
    return rows


async def kill_rows(services: Services, plan: Plan) -> list[Row]:
    jobs, down_s = (40, 3.0) if plan.quick else (200, 20.0)
    found = await kill_round(services, jobs, down_s, timeout_s=90 if plan.quick else 240)
    name = f"upstreams, {jobs} x sleep:2, the simulator capped at 6 SIGKILLed, back {down_s:g} s later"
    note = f"{found.live_at_kill} runs live on it at the kill, {found.after_restart} started on it after" + (
        "; --quick: back after 3 s, not 20 s" if plan.quick else ""
    )
    return [
        Row(name, "jobs completed", [found.completed], target=f"= {jobs}", ideal=jobs, note=note),
        Row(name, "jobs resubmitted (attempts > 1)", [found.resubmitted], target="-"),
        Row(
            name, "makespan s", [found.makespan_s], target=f"{jobs / sum(CAPS) * (2 + SIM_STEP_S):.1f} s without a kill"
        ),
        Row(
            name, "runs per Idempotency-Key, most (simulators' logs)", [found.most_runs_per_key], target="= 1", ideal=1
        ),
        Row(
            name,
            "job.accepted per attempt, most (broker events)",
            [found.most_accepted_per_attempt],
            target="= 1",
            ideal=1,
        ),
    ]
