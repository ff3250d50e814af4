"""Row 8: the broker on a Redis Cluster beside the same broker on a single Redis (SPEC S9, issue 12).

A local cluster of 3 masters + 3 replicas (benchlib.cluster: redis-server >= 7, no persistence) and, as the
baseline, one plain redis-server started from the same binary, so the two sides differ only in being a
cluster. Brokers get REDIS_URL = one node and REDIS_CLUSTER=true. Cluster and single rounds alternate:

- create at c8 and c64, c64 only with --quick (scenarios/create.py's rounds: Hermes busy, a fresh broker on
  an emptied store);
- end to end on 1 and 2 replicas (scenarios/e2e.py's rounds), with Redis commands per job summed over the
  masters; the note splits the cluster's commands master by master.

Without a redis-server and redis-cli >= 7 the row says why and is skipped.
"""

from __future__ import annotations

import contextlib
import statistics
import sys

from benchlib.backend import Backend, SingleRedis
from benchlib.cluster import LocalCluster, missing_redis_7
from benchlib.figures import Row
from benchlib.procs import Proc, Services, spawn_redis
from benchlib.run import Plan
from benchlib.scenarios import create, e2e
from broker.store.embedded import free_port, redis_version

NAME = "cluster"


async def create_rows(services: Services, plan: Plan, sides: list[tuple[str, Backend]]) -> list[Row]:
    rows: list[Row] = []
    for concurrency in plan.cluster_concurrencies:
        name = f"{NAME}: create c{concurrency}"
        rate, p99 = Row(name, "req/s"), Row(name, "p99 ms")
        failed = {side: 0 for side, _ in sides}
        tool = ""
        for _ in range(plan.rounds):
            for side, backend in sides:
                result = await create.broker_round(services, concurrency, plan, backend)
                failed[side] += result.failed
                tool = result.tool
                getattr(rate, side).append(result.rate)
                getattr(p99, side).append(result.p99_ms)
        non2xx = ", ".join(f"{count} non-2xx on the {side}" for side, count in failed.items() if count)
        rate.note = f"{tool}, {plan.load_s:g} s per round, 1 broker" + (f", {non2xx}" if non2xx else "")
        rows += [rate, p99]
    return rows


async def e2e_rows(services: Services, plan: Plan, sides: list[tuple[str, Backend]]) -> list[Row]:
    rates = {replicas: Row(f"{NAME}: end to end, {replicas} replica{'s' * (replicas > 1)}", "jobs/s")
             for replicas in plan.cluster_replicas}  # fmt: skip
    commands = Row(f"{NAME}: end to end, Redis commands per job", "commands")
    split: list[list[float]] = []  #: the cluster's commands per job, master by master, round by round
    events = 0
    for _ in range(plan.rounds):
        for replicas, row in rates.items():
            for side, backend in sides:
                result = await e2e.broker_round(services, replicas, plan.cluster_jobs, backend)
                getattr(row, side).append(result.rate)
                events = result.events
                if replicas == min(rates):
                    getattr(commands, side).append(result.calls_per_job)
                    if side == "broker":
                        split.append([calls / result.jobs for calls in result.calls])
    first = rates[min(rates)]
    first.note = f"{plan.cluster_jobs} jobs, {events} events/job"
    per_master = "/".join(f"{statistics.median(column):.0f}" for column in zip(*split, strict=True))
    commands.note = f"{min(rates)} replica, summed over the masters; cluster per master: {per_master}"
    return [*rates.values(), commands]


async def run(services: Services, plan: Plan) -> list[Row]:
    reason = missing_redis_7()
    if reason is not None:
        print(f"bench: {NAME}: skipped: {reason}", file=sys.stderr, flush=True)
        return [Row(NAME, "-", target=f"skipped: {reason}")]
    cluster = LocalCluster(services.stack)
    single: SingleRedis | None = None
    proc: Proc | None = None
    try:
        await cluster.start()
        proc, client, url = await spawn_redis(services.stack, "redis-7", cluster.server, free_port(),
                                              "--maxclients", "18000")  # fmt: skip
        single = SingleRedis(client, url)
        sides: list[tuple[str, Backend]] = [("broker", cluster), ("baseline", single)]
        rows = await create_rows(services, plan, sides) + await e2e_rows(services, plan, sides)
    finally:
        await cluster.close()
        if single is not None:
            with contextlib.suppress(Exception):
                await single.client.aclose()
        for node in [*cluster.procs, *([proc] if proc else [])]:  # free the CPU for the rows after this one
            services.stack.stop(node)
    redis = ".".join(map(str, redis_version(cluster.server)))
    rows[0].note += f"; broker on a 3+3 cluster vs on one redis-server, both Redis {redis} ({cluster.server})"
    return rows
