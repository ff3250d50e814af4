"""Row conversations (SPEC S4.3): a session's turns run one at a time in create order (multitask `enqueue`, the
default) against the simulator capped at CAP live runs, one broker replica. The baseline column is the ideal, or
the sessionless jobs of the same run.

- S sessions of T `sleep:1` turns and N sessionless `sleep:1` jobs, all created at once: in T waves, each once the
  previous one answered, of one turn of every session and N / T sessionless jobs spread among them, CREATORS
  creates in flight. From every job's events (GET /v1/runs/{id}/events replays them; a job runs from its first
  `job.accepted` to its terminal event): pairs of one session's turns that overlap (0), sessions whose turns
  started out of create order (0), the makespan (first create .. last terminal) against the ideal,
  max(T runs, (S x T + N) runs / CAP), and the gap from a turn's end to its next turn's start (p50, p99). With
  the cap full, that gap is mostly the next turn's wait for its place in the line (the jobs created before it go
  first), so the row also shows how late a turn started after it was due (its session free and every job created
  before it started: the handover itself; p99 within 1 s) beside the same figure of the sessionless jobs (due once
  every job created before it started), and counts the turns a job created after them went before, more than
  GRACE_S after they were due (0). Creation order is the jobs' `created_at`; the line's own order (the job write's)
  can differ by a few ms among concurrent creates.
- Redis commands per job (INFO commandstats, the scripts' own commands included, from the first create until the
  simulator settled the last run) of P session turns (P / T sessions) beside P sessionless jobs, each run alone
  with the same cap and runs: what a turn adds (session_turn.lua at its create and at its runner's first check,
  session_release.lua at its end).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import aiohttp
import orjson

from benchlib.figures import Row, percentile
from benchlib.load import gather_limited, post_json
from benchlib.procs import Services
from benchlib.run import Plan, redis_calls, settled_jobs, sim_settled
from benchlib.scenarios.admission import SIM_STEP_S, creates
from benchlib.scenarios.upstreams_fleet import job_events
from benchlib.turns import Handover, handovers, job_times, lateness, out_of_order, overlaps

CREATORS = 64  #: creates in flight at once
READERS = 16  #: event streams read at once
TEXT = "bench conversations"
GRACE_S = 1.0  #: how long after a turn was due a job created after it may still start before it


@dataclass
class Figures:
    makespan_s: float
    overlaps: int  #: pairs of one session's turns that ran at the same time
    out_of_order: int  #: sessions whose turns did not start in create order
    handovers: list[Handover]  #: a turn's end to its next turn's start, every pair
    solo_late: list[float]  #: each sessionless job's start after it was due
    turns_end_s: float  #: first create .. the last turn's terminal
    solo_end_s: float  #: first create .. the last sessionless job's terminal
    refused: float  #: the simulator's 429s per accepted run


def interleave(sessions: int, solo: int) -> list[int]:
    """A wave's creates in order: session indices (0..sessions-1) with the sessionless ones (-1) spread evenly."""
    marks = [((n + 0.5) / sessions, n) for n in range(sessions)] + [((n + 0.5) / solo, -1) for n in range(solo)]
    return [index for _, index in sorted(marks)]


async def create_all(session: aiohttp.ClientSession, base: str, plan: Plan, sessions: int, solo: int,
                     ) -> tuple[list[list[str]], list[str]]:  # fmt: skip
    """Create in T waves, each once the previous answered: a turn of every session and 1/T of the sessionless
    jobs, spread evenly, CREATORS at a time. (Every session's job ids in create order, the sessionless ones.)"""
    work = f"sleep:{plan.conversation_run_s:g}"
    turns = plan.conversation_turns
    chains: list[list[str]] = [[] for _ in range(sessions)]
    alone: list[str] = []

    def document(index: int, turn: int) -> bytes:
        if index < 0:
            return orjson.dumps({"input": f"{TEXT} sessionless {work}"})
        return orjson.dumps(
            {"input": f"{TEXT} turn {turn + 1} {work}", "session_id": f"bench-conversation-{index:04d}"}
        )

    for turn in range(turns):
        wave = interleave(sessions, solo * (turn + 1) // turns - solo * turn // turns)
        bodies = [document(index, turn) for index in wave]
        created = await gather_limited(CREATORS, bodies, lambda body: post_json(session, f"{base}/v1/runs", body))
        for index, answer in zip(wave, created, strict=True):
            (alone if index < 0 else chains[index]).append(str(answer["run_id"]))
    return chains, alone


async def conversations_round(services: Services, plan: Plan) -> Figures:
    sessions, solo = plan.conversation_sessions, plan.conversation_solo
    total = sessions * plan.conversation_turns + solo
    run_s = plan.conversation_run_s + SIM_STEP_S
    await services.reset(max_concurrent=plan.conversation_cap)
    async with services.brokers(1) as procs, aiohttp.ClientSession() as session:
        base = procs[0].url
        chains, solo_ids = await create_all(session, base, plan, sessions, solo)
        ids = [job for chain in chains for job in chain] + solo_ids
        await sim_settled(services, session, total, timeout_s=60 + 2 * total * run_s / plan.conversation_cap)
        objects = {str(job["run_id"]): job for job in await settled_jobs(session, base, ids, timeout_s=60)}
        streams = await gather_limited(READERS, ids, lambda job: job_events(session, base, job))
        stats = await services.sim_stats(session)
    bad = [job for job in objects.values() if job["status"] != "completed"]
    if bad:
        raise RuntimeError(f"{len(bad)} of {len(objects)} jobs did not complete: {bad[:2]}")
    jobs = {
        key: job_times(float(str(objects[key]["created_at"])), events) for key, events in zip(ids, streams, strict=True)
    }
    turns = [[jobs[key] for key in chain] for chain in chains]
    everyone = list(jobs.values())
    began = min(one.created for one in everyone)

    def last_end(keys: list[str]) -> float:
        return max((float(str(objects[key]["updated_at"])) - began for key in keys), default=float("nan"))

    return Figures(
        makespan_s=last_end(ids),
        overlaps=sum(overlaps(chain) for chain in turns),
        out_of_order=sum(out_of_order(chain) for chain in turns),
        handovers=[one for chain in turns for one in handovers(chain, everyone, GRACE_S)],
        solo_late=lateness([jobs[key] for key in solo_ids], everyone),
        turns_end_s=last_end(ids[: len(ids) - len(solo_ids)]),
        solo_end_s=last_end(solo_ids),
        refused=creates(stats, "429") / max(1, creates(stats, "202")),
    )


async def commands_round(services: Services, plan: Plan, turns: bool) -> tuple[float, float]:
    """(Redis commands per job, EVALSHA per job) of P session turns, or of P sessionless jobs, run alone."""
    await services.reset(max_concurrent=plan.conversation_cap)
    sessions = max(1, plan.conversation_probe // plan.conversation_turns) if turns else 0
    solo = 0 if turns else plan.conversation_probe
    count = sessions * plan.conversation_turns + solo
    async with services.brokers(1) as procs, aiohttp.ClientSession() as session:
        await services.r.config_resetstat()  # the broker's start-up is not the jobs'
        await create_all(session, procs[0].url, plan, sessions, solo)
        run_s = plan.conversation_run_s + SIM_STEP_S
        await sim_settled(services, session, count, timeout_s=60 + 2 * count * run_s / plan.conversation_cap)
        await asyncio.sleep(0.2)  # the terminal append and the session's release follow the simulator's last event
        stats = await services.r.info("commandstats")
    evalsha = stats.get("cmdstat_evalsha", {})
    scripts = int(evalsha["calls"]) if isinstance(evalsha, dict) else 0
    return redis_calls(stats) / count, scripts / count


async def run(services: Services, plan: Plan) -> list[Row]:
    sessions, turns, solo, cap = (plan.conversation_sessions, plan.conversation_turns, plan.conversation_solo,
                                  plan.conversation_cap)  # fmt: skip
    run_s = plan.conversation_run_s + SIM_STEP_S
    total = sessions * turns + solo
    ideal = max(turns * run_s, total * run_s / cap)
    figures = await conversations_round(services, plan)
    work = f"sleep:{plan.conversation_run_s:g}"
    name = f"conversations, {sessions} sessions x {turns} turns + {solo} sessionless, {work}, cap {cap}, 1 replica"
    where = (f"turns ended by {figures.turns_end_s:.1f} s, sessionless by {figures.solo_end_s:.1f} s; utilisation "
             f"{total * run_s / (cap * figures.makespan_s):.2f}; 429s per run {figures.refused:.2f}")  # fmt: skip
    gaps = [one.gap for one in figures.handovers]
    late = [one.late for one in figures.handovers]
    overtaken = sum(one.overtaken for one in figures.handovers)
    due = "due: its session free and every job created before it started; baseline: the sessionless jobs, same run"
    rows = [
        Row(name, "makespan s", [figures.makespan_s], target=f"ideal {ideal:.1f} s (<= {1.15 * ideal:.1f})",
            ideal=ideal, note=where),
        Row(name, "pairs of a session's turns that overlapped", [figures.overlaps], target="ideal 0"),
        Row(name, "sessions whose turns started out of create order", [figures.out_of_order], target="ideal 0"),
        Row(name, "gap, a turn's end to the next one's start, p50 s", [percentile(gaps, 50)], target="-",
            note="includes the next turn's wait for its place in the line"),
        Row(name, "gap, a turn's end to the next one's start, p99 s", [percentile(gaps, 99)], target="<= 1 s",
            ideal=1.0, note=f"max {max(gaps, default=math.nan):.2f} s"),
        Row(name, "a turn's start after it was due, p50 s", [percentile(late, 50)], [percentile(figures.solo_late, 50)],
            note=due),
        Row(name, "a turn's start after it was due, p99 s", [percentile(late, 99)], [percentile(figures.solo_late, 99)],
            note=f"target <= 1 s; max {max(late, default=math.nan):.2f} s"),
        Row(name, f"turns a later job went before, > {GRACE_S:g} s after they were due", [overtaken],
            target="ideal 0"),
    ]  # fmt: skip
    turn_calls, turn_scripts = await commands_round(services, plan, turns=True)
    solo_calls, solo_scripts = await commands_round(services, plan, turns=False)
    probe_sessions = max(1, plan.conversation_probe // turns)
    name = (f"conversations, {probe_sessions * turns} turns of {probe_sessions} sessions vs {plan.conversation_probe} "
            f"sessionless jobs, each run alone, {work}, cap {cap}, 1 replica")  # fmt: skip
    note = f"baseline: the sessionless jobs; EVALSHA per job {turn_scripts:.2f} vs {solo_scripts:.2f}"
    return [*rows, Row(name, "Redis commands per job", [turn_calls], [solo_calls], note=note)]
