"""The `upstreams` row's sessions round (issue 20): S sessions of 4 turns each over the three simulators, all the
sessions at once, each turn created once the session's previous one ended. Every turn must run on its
session's upstream, checked two ways: the job object's `upstream` (the broker's word) and the simulators'
request logs with their runs' `session_id` (the simulators' own record of which of them ran which run).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import aiohttp
import orjson

from benchlib.load import gather_limited, post_json
from benchlib.procs import Services
from benchlib.run import get_json
from benchlib.scenarios.upstreams_fleet import Request, job_events, requests, simulators
from benchlib.upstream_logs import job_of, on_own_upstream, spread, started_runs

TURNS = 4
TURN = "bench upstreams session turn sleep:0.2"
ENDS = frozenset({"run.completed", "run.failed", "run.cancelled"})


@dataclass
class SessionsRound:
    makespan_s: float
    turns: int
    by_job_object: int  #: turns on their session's upstream by the job objects' `upstream`
    by_simulators: int  #: the same by the simulators' logs and runs
    spread: str  #: sessions per upstream, in CAPS order


async def sessions_round(services: Services, sessions: int) -> SessionsRound:
    async with simulators(services) as fleet:
        extra = {"HERMES_URL": ",".join(fleet.urls), "HERMES_MAX_CONCURRENT": "0"}
        async with services.brokers(1, extra) as procs, aiohttp.ClientSession() as session:
            base = procs[0].url
            names = [f"bench-session-{n:03d}" for n in range(sessions)]
            talks = await asyncio.gather(*(conversation(session, base, name) for name in names))
            turns_of = dict(zip(names, talks, strict=True))
            jobs = [job for turns in turns_of.values() for job in turns]
            objects = {str(job["run_id"]): job for job in await gather_limited(
                16, jobs, lambda job: get_json(session, f"{base}/v1/runs/{job}"))}  # fmt: skip
            logs = [await requests(session, url) for url in fleet.urls]
            sim_session: dict[tuple[int, str], str] = {}  # (simulator, its run id) -> the run's session_id
            for index, (url, log) in enumerate(zip(fleet.urls, logs, strict=True)):
                for _, run_id in started_runs(log):
                    sim_session[index, run_id] = str((await get_json(session, f"{url}/v1/runs/{run_id}"))["session_id"])
    bad = [job for job in objects.values() if job["status"] != "completed"]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(objects)} turns did not complete: {bad[:2]}")
    if len(sim_session) != len(objects):
        raise RuntimeError(f"the simulators started {len(sim_session)} runs for {len(objects)} turns")
    names_of = fleet.names
    agree(objects, logs, names_of)
    sim_turns: dict[str, list[str | None]] = {name: [] for name in turns_of}
    for (index, _), name in sim_session.items():
        if name not in sim_turns:
            raise RuntimeError(f"a simulator ran a run of the unknown session {name!r}")
        sim_turns[name].append(names_of[index])
    by_object = {name: [upstream(objects[job]) for job in turns] for name, turns in turns_of.items()}
    first = {name: str(upstreams[0]) for name, upstreams in by_object.items()}
    created = min(float(str(job["created_at"])) for job in objects.values())
    ended = max(float(str(job["updated_at"])) for job in objects.values())
    return SessionsRound(ended - created, len(objects), on_own_upstream(by_object), on_own_upstream(sim_turns),
                         spread(first, names_of))  # fmt: skip


async def conversation(session: aiohttp.ClientSession, base: str, name: str) -> list[str]:
    """The session's turns one after the other, each created once the previous one ended: their job ids."""
    turns = []
    for turn in range(TURNS):
        body = orjson.dumps({"input": f"{TURN} {turn + 1}", "session_id": name})
        job = str((await post_json(session, f"{base}/v1/runs", body))["run_id"])
        events = await job_events(session, base, job)  # returns once the turn ended
        if not events or events[-1].get("event") not in ENDS:
            raise RuntimeError(f"the events of {job} closed before its terminal event: {events[-1:]}")
        turns.append(job)
    return turns


def agree(objects: dict[str, dict[str, object]], logs: list[list[Request]], names: list[str]) -> None:
    """Raise unless each job's key started exactly one run, on the simulator its job object names."""
    ran_on: dict[str, list[str]] = {}
    for index, log in enumerate(logs):
        for key, _ in started_runs(log):
            ran_on.setdefault(job_of(key), []).append(names[index])
    disagree = [job for job, found in objects.items() if ran_on.get(job) != [found["upstream"]]]
    if disagree:
        job = objects[disagree[0]]
        raise RuntimeError(f"{len(disagree)} turns' job objects disagree with the simulators' logs: {job['run_id']} "
                           f"upstream {job['upstream']}, started on {ran_on.get(str(job['run_id']))}")  # fmt: skip


def upstream(job: dict[str, object]) -> str | None:
    found = job.get("upstream")
    return None if found is None else str(found)
