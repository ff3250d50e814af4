"""The `upstreams` row's killed-simulator round (issue 20): N `sleep:2` jobs over the three simulators; once the
one capped at 6 (a process of the round's own) has its live runs, it is SIGKILLed and started again on its port
(same cap, same step) some seconds later. Every job must complete, and no attempt may run twice: across the
simulators' request logs no Idempotency-Key started two runs, and in the broker's own record (each job's events)
no attempt was accepted twice. The killed process's log is lost with it: the round reads it just before the kill,
so a create answered in the last moment before the SIGKILL may be missing from it (the broker side covers it).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp
import orjson

from benchlib.load import gather_limited, post_json
from benchlib.procs import Services
from benchlib.run import settled_jobs, wait_until
from benchlib.scenarios.upstreams_fleet import CAPS, job_events, requests, simulators, stats
from benchlib.upstream_logs import accepted_per_attempt, ran_twice, runs_per_key, started_runs

KILLED = 1  #: the simulator capped at 6
RUN = "bench upstreams kill sleep:2"


@dataclass
class KillRound:
    jobs: int
    completed: int
    resubmitted: int  #: jobs with attempts > 1
    makespan_s: float
    live_at_kill: int  #: runs live on the killed simulator when it was killed
    after_restart: int  #: runs the restarted simulator started
    most_runs_per_key: int  #: across the simulators' logs (1: no key started two runs)
    most_accepted_per_attempt: int  #: across the jobs' events (1: no attempt accepted twice)


async def kill_round(services: Services, jobs: int, down_s: float, timeout_s: float) -> KillRound:
    async with simulators(services) as fleet:
        extra = {"HERMES_URL": ",".join(fleet.urls), "HERMES_MAX_CONCURRENT": "0"}
        async with services.brokers(1, extra) as procs, aiohttp.ClientSession() as session:
            base, killed_url = procs[0].url, fleet.urls[KILLED]
            body = orjson.dumps({"input": RUN})
            created = await gather_limited(64, [base] * jobs, lambda url: post_json(session, f"{url}/v1/runs", body))
            ids = [str(job["run_id"]) for job in created]

            async def full() -> bool:
                return int(str((await stats(session, killed_url))["live"])) >= CAPS[KILLED]

            await wait_until(full, 30, f"{CAPS[KILLED]} live runs on the simulator to kill")
            await asyncio.sleep(1)  # the runs are half-way
            live = int(str((await stats(session, killed_url))["live"]))
            before = await requests(session, killed_url)  # its log dies with it
            fleet.kill(KILLED)
            restart_at = time.monotonic() + down_s
            await asyncio.sleep(max(0.0, restart_at - time.monotonic()))
            await fleet.restart(KILLED)
            done = await settled_jobs(session, base, ids, timeout_s=timeout_s)
            logs = [before, *[await requests(session, url) for url in fleet.urls]]
            events = await gather_limited(16, ids, lambda job: job_events(session, base, job))
    twice = ran_twice(logs)
    if twice:
        raise RuntimeError(f"{len(twice)} Idempotency-Keys started more than one run: {sorted(twice.items())[:5]}")
    per_attempt = [accepted_per_attempt(found) for found in events]
    doubled = [
        (job, dict(counts)) for job, counts in zip(ids, per_attempt, strict=True) if max(counts.values(), default=0) > 1
    ]
    if doubled:
        raise RuntimeError(f"{len(doubled)} jobs had an attempt accepted twice: {doubled[:5]}")
    bad = [job for job in done if job["status"] != "completed"]
    if bad:
        first = bad[0]
        raise RuntimeError(f"{len(bad)} of {jobs} jobs did not complete: {first['run_id']} {first['status']} "
                           f"{first['error']}")  # fmt: skip
    makespan = max(float(str(job["updated_at"])) for job in done) - min(float(str(job["created_at"])) for job in done)
    return KillRound(
        jobs=jobs,
        completed=len(done) - len(bad),
        resubmitted=sum(1 for job in done if int(str(job["attempts"])) > 1),
        makespan_s=makespan,
        live_at_kill=live,
        after_restart=len(started_runs(logs[1 + KILLED])),
        most_runs_per_key=max(runs_per_key(logs).values(), default=0),
        most_accepted_per_attempt=max((max(counts.values(), default=0) for counts in per_attempt), default=0),
    )
