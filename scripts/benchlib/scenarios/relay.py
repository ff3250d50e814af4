"""Row 3: event relay. One replica follows R runs that each stream D `message.delta` as fast as the simulator
can (`deltas:D`); events appended per second = the job streams' XLEN sum over first create .. last terminal.

Baseline: scripts/bench_baselines/relay.py, a bare loop reading the same simulator streams and XADDing each
batch it read in one pipelined round trip, timed the same way.
"""

from __future__ import annotations

import json
import time

import aiohttp

from benchlib.figures import Row
from benchlib.load import create_body, gather_limited, post_json
from benchlib.procs import Services
from benchlib.run import Plan, settled_jobs, sim_settled
from broker.store import keys


async def broker_round(services: Services, plan: Plan) -> float:
    await services.reset()
    async with services.brokers(1) as (broker,):
        body = create_body(f"bench relay deltas:{plan.relay_deltas}", pad_to=0)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            started = time.time()
            jobs = await gather_limited(32, list(range(plan.relay_runs)),
                                        lambda _: post_json(session, f"{broker.url}/v1/runs", body))  # fmt: skip
            await sim_settled(services, session, plan.relay_runs, timeout_s=120)
            ids = [str(job["run_id"]) for job in jobs]
            finished = await settled_jobs(session, broker.url, ids, timeout_s=120)
        ended = max(float(str(job["updated_at"])) for job in finished)
        pipe = services.r.pipeline(transaction=False)
        for job_id in ids:
            pipe.xlen(keys.events(job_id))
        events = int(sum(await pipe.execute()))
    expected = plan.relay_runs * plan.relay_deltas
    if events < expected:
        raise RuntimeError(f"the broker stored {events} events of at least {expected}")
    return events / (ended - started)


async def baseline_round(services: Services, plan: Plan) -> float:
    await services.reset()
    env = {"BENCH_RUNS": str(plan.relay_runs), "BENCH_INPUT": f"bench relay deltas:{plan.relay_deltas}",
           "BENCH_PREFIX": "relay:"}  # fmt: skip
    async with services.baseline("relay.py", env) as proc:
        figures = json.loads(await proc.output(timeout_s=120))
    return float(figures["events"]) / (float(figures["ended"]) - float(figures["started"]))


async def run(services: Services, plan: Plan) -> list[Row]:
    row = Row("event relay", "events/s")
    row.note = f"1 replica, {plan.relay_runs} runs x {plan.relay_deltas} deltas; baseline: bare read+XADD loop"
    for _ in range(plan.rounds):
        row.broker.append(await broker_round(services, plan))
        row.baseline.append(await baseline_round(services, plan))
    return [row]
