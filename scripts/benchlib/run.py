"""Sizes of a run (full or --quick) and the small polling helpers the scenarios share."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp

from benchlib.load import gather_limited
from benchlib.procs import Services

TERMINAL = frozenset({"completed", "failed", "cancelled"})


@dataclass(frozen=True)
class Plan:
    quick: bool
    rounds: int  #: alternating broker/baseline rounds of the rows that have a measured baseline
    warmup_s: float
    load_s: float
    e2e_jobs: int
    relay_runs: int
    relay_deltas: int
    fanout_subscribers: int
    fanout_events: int
    fanout_seconds: float
    fanout_lead_s: float  #: the simulator's start-up pause, while the subscribers attach
    idle_clients: int
    memory_jobs: int
    memory_rounds: int
    realistic_jobs: int  #: jobs of 1,000 deltas and 10 tool calls in the memory row (issue 21)
    admission_jobs: int
    admission_rounds: int
    refusal_jobs: int  #: 0: skip the refusal and learnt-limit runs
    refusal_s: float
    drain_timeout_s: float  #: how long the refusal run waits for its jobs to end after it
    cluster_jobs: int  #: end-to-end jobs per round of the cluster row
    cluster_replicas: tuple[int, ...]  #: the cluster row's end-to-end broker replica counts
    cluster_concurrencies: tuple[int, ...]  #: the cluster row's create concurrencies
    fairness_backlog: int  #: key A's `sleep:1` jobs before key B's (S4.2)
    fairness_late: int  #: key B's jobs
    fairness_weighted: int  #: jobs of each of the keys of weights 3 and 1
    scrape_keys: int  #: waiting jobs, one fairness key each, of the scrape row (SPEC S4.2)
    scrape_entries: int  #: entries of the job whose deltas the scrape row removes (SPEC S3.6)
    conversation_sessions: int  #: sessions of the conversations row (SPEC S4.3), all created at once
    conversation_turns: int  #: turns per session
    conversation_solo: int  #: sessionless jobs created beside them
    conversation_cap: int  #: the simulator's cap of live runs in that row
    conversation_run_s: float  #: each run's `sleep:`
    conversation_probe: int  #: jobs of each of the row's two Redis-commands runs (sessionless, session turns)
    quota_jobs: int  #: jobs of each of the quotas row's two keys (SPEC S4.4)
    budget_jobs: int  #: jobs of the key with a token budget

    @classmethod
    def full(cls) -> Plan:
        return cls(
            quick=False, rounds=5, warmup_s=1, load_s=2,
            e2e_jobs=2000,
            relay_runs=64, relay_deltas=3000,
            fanout_subscribers=1000, fanout_events=40, fanout_seconds=3, fanout_lead_s=1.5,
            idle_clients=10_000,
            memory_jobs=1000, memory_rounds=2, realistic_jobs=60,
            admission_jobs=100, admission_rounds=2, refusal_jobs=1000, refusal_s=60, drain_timeout_s=75,
            cluster_jobs=1000, cluster_replicas=(1, 2), cluster_concurrencies=(8, 64),
            fairness_backlog=300, fairness_late=30, fairness_weighted=80,
            scrape_keys=100_000, scrape_entries=100_000,
            conversation_sessions=200, conversation_turns=5, conversation_solo=500, conversation_cap=10,
            conversation_run_s=1.0, conversation_probe=100,
            quota_jobs=200, budget_jobs=40,
        )  # fmt: skip

    @classmethod
    def smoke(cls) -> Plan:
        return cls(
            quick=True, rounds=1, warmup_s=0.3, load_s=1,
            e2e_jobs=100,
            relay_runs=8, relay_deltas=100,
            fanout_subscribers=50, fanout_events=10, fanout_seconds=1.5, fanout_lead_s=0.8,
            idle_clients=200,
            memory_jobs=50, memory_rounds=1, realistic_jobs=4,
            admission_jobs=20, admission_rounds=1, refusal_jobs=0, refusal_s=0, drain_timeout_s=0,
            cluster_jobs=60, cluster_replicas=(1,), cluster_concurrencies=(64,),
            fairness_backlog=30, fairness_late=6, fairness_weighted=16,
            scrape_keys=2_000, scrape_entries=5_000,
            conversation_sessions=5, conversation_turns=3, conversation_solo=10, conversation_cap=4,
            conversation_run_s=0.2, conversation_probe=12,
            quota_jobs=20, budget_jobs=16,
        )  # fmt: skip


async def wait_until(probe: Callable[[], Awaitable[bool]], timeout_s: float, what: str, every_s: float = 0.1) -> None:
    deadline = time.monotonic() + timeout_s
    while not await probe():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what}: not within {timeout_s:g} s")
        await asyncio.sleep(every_s)


async def get_json(session: aiohttp.ClientSession, url: str) -> dict[str, object]:
    async with session.get(url) as answer:
        payload: dict[str, object] = await answer.json(content_type=None)
        return payload


async def jobs_now(session: aiohttp.ClientSession, base: str, job_ids: list[str]) -> list[dict[str, object]]:
    """Every job's object as it is now (GET, 16 at a time)."""
    return await gather_limited(16, job_ids, lambda job: get_json(session, f"{base}/v1/runs/{job}"))


async def settled_jobs(session: aiohttp.ClientSession, base: str, job_ids: list[str], timeout_s: float,
                       ) -> list[dict[str, object]]:  # fmt: skip
    """Every job's object once it is terminal (GET, 16 at a time, re-polling the unfinished ones)."""
    done: dict[str, dict[str, object]] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        left = [job for job in job_ids if job not in done]
        if not left:
            return [done[job] for job in job_ids]
        if time.monotonic() > deadline:
            raise RuntimeError(f"{len(left)} of {len(job_ids)} jobs not terminal within {timeout_s:g} s")
        for job in await jobs_now(session, base, left):
            if job.get("status") in TERMINAL:
                done[str(job["run_id"])] = job
        if len(done) < len(job_ids):
            await asyncio.sleep(0.2)


async def sim_settled(services: Services, session: aiohttp.ClientSession, count: int, timeout_s: float) -> None:
    """Wait until the simulator has settled `count` runs (costs the broker and Redis nothing)."""

    async def probe() -> bool:
        return int(str((await services.sim_stats(session))["settled"])) >= count

    await wait_until(probe, timeout_s, f"{count} runs settled on the simulator")


def redis_calls(info: dict[str, object]) -> int:
    """Commands Redis ran (commandstats), leaving out the benchmark's own INFO and CONFIG."""
    total = 0
    for name, stats in info.items():
        if name.startswith("cmdstat_") and name not in ("cmdstat_info", "cmdstat_config") and isinstance(stats, dict):
            total += int(stats["calls"])
    return total
