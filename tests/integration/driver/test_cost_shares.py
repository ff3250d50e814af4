"""What a turn costs (SPEC S4.2, `ADMISSION_FAIRNESS_COST`), driven end to end: real Redis (both backends), real
HTTP, the simulator in-process with `sleep:N` runs. The share of Hermes time each key's runs took is measured from the
simulator's runs: those started while both keys still had jobs waiting."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.admission.cost import CostMode, CostSettings, History
from broker.simulator.state import SimRun, Simulator
from broker.store.cost_entry import CostEntry
from broker.store.cost_store import CostStore
from broker.store.jobs import JobStore
from broker.store.usage import encode
from projections.usage import Used
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled
from tests.integration.driver.test_admission import create_keys, displacement

pytestmark = BOTH_BACKENDS

Client = TestClient[Any, Any]
GUESS = 200  #: ADMISSION_FAIRNESS_GUESS of these tests (ms): the first runs' estimate, corrected at their settles


async def submit(client: Client, text: str, key: str, weight: float = 1.0) -> str:
    body = {"input": text, "scheduling": {"fairness_key": key, "fairness_weight": weight}}
    job_id: str = (await create(client, body))["run_id"]
    return job_id


async def backlogs(client: Client, jobs: dict[str, tuple[int, float, float]]) -> dict[str, list[str]]:
    """Each key's backlog: key -> (jobs, run seconds, weight), created key after key."""
    made: dict[str, list[str]] = {}
    for key, (count, seconds, weight) in jobs.items():
        made[key] = [await submit(client, f"{key} {i} sleep:{seconds}", key, weight) for i in range(count)]
    return made


def started(sim: Simulator) -> list[tuple[str, SimRun]]:
    """(job, its run) of every create Hermes accepted, in order (one new run per accepted create)."""
    return list(zip(create_keys(sim, 202), sim.runs.values(), strict=True))


def time_shares(sim: Simulator, made: dict[str, list[str]], window_s: float) -> dict[str, float]:
    """Each key's share of the Hermes time of the runs started in the first `window_s` seconds of the first run."""
    owner = {job_id: key for key, jobs in made.items() for job_id in jobs}
    runs = [(job_id, run) for job_id, run in started(sim) if job_id in owner and run.status == "completed"]
    first = min(run.created_at for _, run in started(sim))
    used = dict.fromkeys(made, 0.0)
    for job_id, run in runs:
        if run.created_at - first <= window_s:
            used[owner[job_id]] += run.updated_at - run.created_at
    total = sum(used.values())
    return {key: spent / total for key, spent in used.items()}


async def assert_started_in_arrival_order(client: Client, sim: Simulator, jobs: list[str]) -> None:
    """The key's `jobs` (arrival order) started in that order: its runs reached Hermes in arrival order (two granted
    in one pass in either order), and a job passed over had left the line before the later one's run started (the
    stops that end the window cancel a key's next jobs in any order, and a pass meanwhile takes the first one still
    waiting: on a cluster, under load, dozens of places on)."""
    runs = {job_id: run for job_id, run in started(sim) if job_id in jobs}
    mine = list(runs)
    assert displacement(mine, sorted(mine, key=jobs.index)) <= 1, [jobs.index(job_id) for job_id in mine]
    last = max(jobs.index(job_id) for job_id in mine)
    for passed in (job_id for job_id in jobs[: last - 1] if job_id not in runs):
        view = await job(client, passed)
        later = [runs[job_id].created_at for job_id in mine if jobs.index(job_id) > jobs.index(passed) + 1]
        assert view["status"] == "cancelled" and view["updated_at"] <= min(later), (jobs.index(passed), view)


async def drive_for(make_replica: ClientFactory, mode: str, window_s: float, made: dict[str, list[str]]) -> Client:
    """A replica of two slots drives for `window_s`, then every job left is stopped (the backlogs never ran out)."""
    replica = await make_replica(hermes_max_concurrent=2, admission_fairness_cost=mode, admission_fairness_guess=GUESS)
    await asyncio.sleep(window_s)  # the measure is a span of real time: what the runs started in it took
    await asyncio.gather(*(replica.post(f"/v1/runs/{job_id}/stop") for jobs in made.values() for job_id in jobs))
    return replica


@pytest.mark.parametrize(("mode", "long_share"), [("time", (0.4, 0.6)), ("runs", (0.8, 0.97))])
async def test_two_backlogged_keys_of_long_and_short_runs_share_the_hermes_time(
    make_client: ClientFactory,
    make_replica: ClientFactory,
    sim: Simulator,
    mode: str,
    long_share: tuple[float, float],
) -> None:
    # Given two backlogged keys of weight 1 whose runs take 0.4 s and 0.04 s
    client = await make_client(admission_fairness_cost=mode, admission_fairness_guess=GUESS)
    made = await backlogs(client, {"long": (30, 0.4, 1.0), "short": (130, 0.04, 1.0)})
    # When one replica drives them two at a time for 4 s
    await drive_for(make_replica, mode, 4.0, made)
    shares = time_shares(sim, made, 3.5)
    # Then under `time` each key took about half of the Hermes time; under `runs` (counting jobs) the long key 0.9
    assert long_share[0] <= shares["long"] <= long_share[1], shares
    # and each key's jobs started in its arrival order
    for jobs in made.values():
        await assert_started_in_arrival_order(client, sim, jobs)


async def test_weights_three_to_one_share_the_hermes_time_three_to_one(
    make_client: ClientFactory, make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given two backlogged keys of weights 3 and 1 whose runs take 0.1 s and 0.05 s
    client = await make_client(admission_fairness_cost="time", admission_fairness_guess=GUESS)
    made = await backlogs(client, {"heavy": (60, 0.1, 3.0), "light": (40, 0.05, 1.0)})
    # When they are driven two at a time for 3 s
    await drive_for(make_replica, "time", 3.0, made)
    # Then the heavy key took about three quarters of the Hermes time
    shares = time_shares(sim, made, 2.5)
    assert 0.65 <= shares["heavy"] <= 0.85, shares


async def test_a_settle_corrects_the_charge_by_the_measured_time_once(
    make_replica: ClientFactory, redis: Redis
) -> None:
    # Given a replica charging slot time, and one run of a key that takes 0.3 s
    replica = await make_replica(admission_fairness_cost="time", admission_fairness_guess=GUESS)
    job_id = await submit(replica, "one sleep:0.3", "k")
    done = await settled(replica, job_id)
    assert done["status"] == "completed"
    costs = CostStore(redis, CostSettings(CostMode.TIME, GUESS), 60_000)

    async def learnt() -> History | None:
        history = await costs.history("k")
        return history if history.runs else None

    # Then its key learnt the measured time (not the guess), and its charge in flight is gone: F = begin + measured
    history = await eventually(learnt)
    assert history.runs == 1 and 300 <= history.average <= 1_500
    assert await costs.charge("k", job_id) is None
    line = await costs.key_line("k", 3)
    assert line.queue == () and (line.finish is None or line.finish <= int(history.average) + 1)
    # When the same settling fact is recorded again (another replica, the usage sweep's repair)
    store = JobStore(redis, retention_ms=60_000)
    snapshot = await store.load(job_id)
    assert snapshot is not None
    fact = Used(marker=f"{job_id}:end", key="k", at_ms=int(time.time() * 1000), hermes_ms=5_000, runs_completed=1)
    entry = CostEntry(redis, CostSettings(CostMode.TIME, GUESS), 60_000)
    await entry.written(snapshot.view, snapshot.view, [(fact.at_ms, encode(fact))], 0)
    # Then nothing is charged or learnt twice
    assert await costs.history("k") == history


async def test_tokens_share_the_tokens_of_the_runs_started(
    make_client: ClientFactory, make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given two backlogged keys whose runs take as long but use 10,000 and 1,000 tokens, charged by tokens
    client = await make_client(admission_fairness_cost="tokens", admission_fairness_guess=2_000)
    made = {
        "big": [await submit(client, f"big {i} tokens:10000 sleep:0.05", "big") for i in range(30)],
        "small": [await submit(client, f"small {i} tokens:1000 sleep:0.05", "small") for i in range(120)],
    }
    # When they are driven two at a time for 3 s
    replica = await make_replica(
        hermes_max_concurrent=2, admission_fairness_cost="tokens", admission_fairness_guess=2_000
    )
    await asyncio.sleep(3.0)
    await asyncio.gather(*(replica.post(f"/v1/runs/{job_id}/stop") for jobs in made.values() for job_id in jobs))
    # Then each key's runs used about half of the tokens of the runs started (counting jobs: the big key 0.9)
    owner = {job_id: key for key, jobs in made.items() for job_id in jobs}
    used = dict.fromkeys(made, 0)
    for job_id, run in started(sim):
        if run.status == "completed" and run.usage:
            used[owner[job_id]] += int(run.usage["total_tokens"])
    assert 0.4 <= used["big"] / (used["big"] + used["small"]) <= 0.6, used


async def test_a_trickle_of_one_job_keys_leaves_a_backlogged_key_its_share(
    make_client: ClientFactory, make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given key a's backlog of 0.1 s runs, charged slot time
    client = await make_client(admission_fairness_cost="time", admission_fairness_guess=GUESS)
    backlog = [await submit(client, f"a {i} sleep:0.1", "a") for i in range(80)]
    replica = await make_replica(
        hermes_max_concurrent=2, admission_fairness_cost="time", admission_fairness_guess=GUESS
    )
    # When a new one-job key (runs as long, created through the replica that drives: its V is its passes') arrives
    # for each run that starts, 30 of them
    newcomers: list[str] = []
    seen = first = 0
    deadline = time.monotonic() + 30
    while len(newcomers) < 30:
        assert time.monotonic() < deadline, "runs stopped starting"
        count = len(create_keys(sim, 202))
        if count > seen:
            first = first or count
            for _ in range(min(count - seen, 30 - len(newcomers))):
                newcomers.append(await submit(replica, "new sleep:0.1", f"new-{len(newcomers)}"))
            seen = count
        else:
            await asyncio.sleep(0.01)  # polling the simulator's creates (a deadline above)
    meanwhile = create_keys(sim, 202)[first:seen]
    await asyncio.gather(*(replica.post(f"/v1/runs/{job_id}/stop") for job_id in backlog + newcomers))
    # Then the backlogged key kept at least about half of the starts while they arrived (its share against the
    # newcomers, paced as one key), and its jobs went in arrival order
    mine = [job_id for job_id in meanwhile if job_id in backlog]
    assert len(mine) >= 0.35 * len(meanwhile), (len(mine), len(meanwhile))
    assert mine == sorted(mine, key=backlog.index)


async def test_a_fresh_replicas_first_creates_queue_in_the_order_they_arrived(
    make_client: ClientFactory, redis: Redis, redis_target: tuple[str, bool]
) -> None:
    if redis_target[1]:
        pytest.skip("on a cluster a create takes its turn in a call of its own: concurrent creates have no order")
    costs = CostStore(redis, CostSettings(CostMode.TIME, GUESS), 60_000)
    for _ in range(3):  # each a replica that has read nothing yet
        # Given a replica charging slot time that just started, and a burst of concurrent creates of one key
        await redis.flushall()
        replica = await make_client(admission_fairness_cost="time", admission_fairness_guess=GUESS)
        answers = await asyncio.gather(*(create(replica, {"input": f"burst {n}"}) for n in range(60)))
        created = {answer["run_id"]: answer["created_at"] for answer in answers}
        # Then the key's queue holds them in the order of their created_at (its first the front in the line)
        queue = (await costs.key_line("", 3)).queue
        assert sorted(queue) == sorted(created)
        assert [created[job_id] for job_id in queue] == sorted(created.values())
