"""Quotas of live runs and token budgets (SPEC S4.4), driven end to end: real Redis (both backends), real HTTP, the
simulator in-process. A key's live runs are read off the simulator's own runs (created → settled), not the broker's
word for them."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.admission.quotas import Quota, Quotas
from broker.clock import SystemClock
from broker.simulator.state import Simulator
from broker.store import keys
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import eventually, job, settled
from tests.integration.driver.test_admission import create_keys
from tests.integration.driver.test_fairness import submit

pytestmark = BOTH_BACKENDS

Client = TestClient[Any, Any]
HOUR_MS = 3_600_000


def peak_live(sim: Simulator, job_ids: list[str]) -> int:
    """The most runs of these jobs Hermes had live at once (each run from its create to its last event)."""
    mine = set(job_ids)
    runs = {
        r["run_id"]
        for r in sim.requests
        if r["method"] == "POST" and r["path"] == "/v1/runs" and r.get("run_id") and r["idempotency_key"] in mine
    }
    assert runs, "no run of these jobs"
    edges = []
    for run_id in runs:
        run = sim.runs[run_id]
        edges += [(run.created_at, 1), (run.updated_at if run.terminal else float("inf"), -1)]
    live = peak = 0
    for _, step in sorted(edges):  # an end before a start at the same instant
        live += step
        peak = max(peak, live)
    return peak


async def hold_of(client: Client, job_id: str) -> dict[str, Any] | None:
    hold: dict[str, Any] | None = (await job(client, job_id))["hold"]
    return hold


async def test_a_key_at_its_live_quota_waits_while_other_keys_use_the_slots(
    make_client: ClientFactory, make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given key a with a live quota of 2 and a line of 8 of its jobs, then 4 of key b's, Hermes with room for 6
    quotas = Quotas(keys=(("a", Quota(live=2)),))
    client = await make_client(admission_quotas=quotas)
    a = [await submit(client, f"a {i} sleep:0.3", key="a") for i in range(8)]
    b = [await submit(client, f"b {i} sleep:0.3", key="b") for i in range(4)]
    # When a replica drives them
    replica = await make_replica(hermes_max_concurrent=6, admission_quotas=quotas)

    async def a_job_shows_its_quota() -> dict[str, Any] | None:
        holds = [await hold_of(replica, job_id) for job_id in a]
        return next((h for h in holds if h is not None and h["reason"] == "quota"), None)

    # Then a waiting job of a shows the quota it waits for
    shown = await eventually(a_job_shows_its_quota, timeout=30)
    assert "'a'" in shown["detail"] and "live quota" in shown["detail"] and shown["retry_at"] >= shown["since"]
    done = [await settled(replica, job_id, timeout=60) for job_id in a + b]
    assert {d["status"] for d in done} == {"completed"}
    # And Hermes never had more than 2 of a's runs live, and had 2 of them at a time
    assert peak_live(sim, a) == 2
    # And b did not wait for a's backlog: all of b started before a's fifth job, each key in arrival order
    order = create_keys(sim, 202)
    assert max(order.index(job_id) for job_id in b) < order.index(a[4])
    assert [job_id for job_id in order if job_id in a] == a and [job_id for job_id in order if job_id in b] == b


async def test_two_replicas_granting_at_once_never_pass_a_keys_live_quota(
    make_client: ClientFactory, make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given key a with a live quota of 3 and two replicas with room for 8 runs each
    quotas = Quotas(keys=(("a", Quota(live=3)),))
    client = await make_client(admission_quotas=quotas)
    first = await make_replica(hermes_max_concurrent=8, admission_quotas=quotas)
    second = await make_replica(hermes_max_concurrent=8, admission_quotas=quotas)
    # When 16 of a's jobs and 6 of b's arrive while both drive
    a = [await submit(client, f"a {i} sleep:0.2", key="a") for i in range(16)]
    b = [await submit(client, f"b {i} sleep:0.2", key="b") for i in range(6)]
    done = [await settled(first if i % 2 else second, job_id, timeout=90) for i, job_id in enumerate(a + b)]
    # Then every job ran once, a's never more than 3 at a time, and nothing is left held or counted live
    assert {d["status"] for d in done} == {"completed"}
    assert sorted(create_keys(sim, 202)) == sorted(a + b)
    assert peak_live(sim, a) == 3
    assert await redis.zcard(keys.quota_held("a")) == 0
    await eventually(lambda: _none_live(redis, "a"))


async def _none_live(redis: Redis, key: str) -> bool:
    return await redis.zcard(keys.quota_live(key)) == 0


async def test_a_key_over_its_token_budget_holds_until_the_window_allows_and_others_run(
    make_client: ClientFactory, make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given key a with a budget of 1,000 tokens per hour, and runs of 600 tokens, one at a time
    quotas = Quotas(keys=(("a", Quota(tokens=1_000, window="1h")),))
    replica = await make_replica(hermes_max_concurrent=1, admission_quotas=quotas)
    a = [await submit(replica, f"a {i} tokens:600", key="a") for i in range(4)]
    # When its first two runs used 1,200 tokens
    first = [await settled(replica, job_id) for job_id in a[:2]]
    assert [d["usage"]["total_tokens"] for d in first] == [600, 600]
    # Then its next jobs hold with reason budget until the hour ends, and another key's job runs meanwhile
    other = await submit(replica, "b 1", key="b")
    assert (await settled(replica, other))["status"] == "completed"

    async def both_held() -> list[dict[str, Any] | None] | None:
        """a's later jobs queue behind its next one (charging time): each shows its hold once a pass took it."""
        found = [await hold_of(replica, job_id) for job_id in a[2:]]
        return found if [h["reason"] if h else None for h in found] == ["budget", "budget"] else None

    holds = await eventually(both_held)
    assert all(h is not None and h["retry_at"] * 1000 % HOUR_MS == 0 for h in holds)
    assert "1000 tokens per 1h" in holds[0]["detail"]  # type: ignore[index]
    assert [(await job(replica, job_id))["status"] for job_id in a[2:]] == ["queued", "queued"]
    assert len(create_keys(sim, 202)) == 3  # a's two and b's one: the budget held a's third


class ShiftedClock:
    """The system's time, moved on by `shift_ms` when a test says an hour has passed."""

    def __init__(self) -> None:
        self.shift_ms = 0

    def now_ms(self) -> int:
        return SystemClock().now_ms() + self.shift_ms


async def test_a_budget_held_key_starts_again_when_its_hour_leaves_the_window(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given key a over its budget of 1,000 tokens per hour, its third job held with reason budget
    clock = ShiftedClock()
    quotas = Quotas(keys=(("a", Quota(tokens=1_000, window="1h")),))
    replica = await make_replica(hermes_max_concurrent=1, admission_quotas=quotas, clock=clock)
    a = [await submit(replica, f"a {i} tokens:600", key="a") for i in range(3)]
    for job_id in a[:2]:
        await settled(replica, job_id)

    async def held_for_budget() -> dict[str, Any] | None:
        hold = await hold_of(replica, a[2])
        return hold if hold is not None and hold["reason"] == "budget" else None

    hold = await eventually(held_for_budget)
    # When the broker's time passes the hold's retry_at (the hour of the 1,200 tokens leaves the window)
    clock.shift_ms = int(hold["retry_at"] * 1000) - SystemClock().now_ms() + 1
    # Then the held job starts and completes, its tokens counted in the new hour
    done = await settled(replica, a[2], timeout=30)
    assert done["status"] == "completed" and done["usage"]["total_tokens"] == 600
    assert a[2] in create_keys(sim, 202)


async def test_a_held_job_that_is_stopped_is_cancelled_and_forgotten(
    make_client: ClientFactory, make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given key a at its live quota of 1 with a second job held
    quotas = Quotas(keys=(("a", Quota(live=1)),))
    replica = await make_replica(hermes_max_concurrent=4, admission_quotas=quotas)
    running = await submit(replica, "a 0 sleep:1.5", key="a")
    held = await submit(replica, "a 1", key="a")

    async def shows_quota() -> bool:
        hold = await hold_of(replica, held)
        return hold is not None and hold["reason"] == "quota"

    await eventually(shows_quota)
    # When the held job is stopped
    assert (await replica.post(f"/v1/runs/{held}/stop")).status == 200
    # Then it is cancelled at once, never sent to Hermes, and leaves the key's held jobs once the key has room
    assert (await job(replica, held))["status"] == "cancelled"
    await settled(replica, running)
    await eventually(lambda: _none_held(redis, "a"))
    assert held not in create_keys(sim)


async def _none_held(redis: Redis, key: str) -> bool:
    return await redis.zcard(keys.quota_held(key)) == 0


async def test_held_jobs_count_as_waiting_for_their_keys_quota_and_show_in_readyz(
    make_replica: ClientFactory, redis: Redis
) -> None:
    # Given key a with one live run at a time and 3 jobs waiting at most, its first run live and 3 more held
    quotas = Quotas(keys=(("a", Quota(live=1, waiting=3)),))
    replica = await make_replica(hermes_max_concurrent=4, admission_quotas=quotas)
    await _one_live_three_held(replica, redis)
    # When a creates a fourth while its three wait out of the line
    answer = await replica.post("/v1/runs", json={"input": "a 4", "scheduling": {"fairness_key": "a"}})
    # Then it is refused by its waiting quota
    body = await answer.json()
    assert (
        answer.status == 429 and body["error"]["code"] == "queue_full" and "waiting quota" in body["error"]["message"]
    )
    # And /readyz shows a at its limits: 1 of 1 live, 3 held of 3 waiting
    shown = (await (await replica.get("/readyz")).json())["admission"]["quotas"]
    assert [(q["key"], q["live"], q["live_quota"], q["held"], q["waiting"], q["waiting_quota"]) for q in shown] == [
        ("a", 1, 1, 3, 3, 3)
    ]
    assert shown[0]["held_for"] == "quota" and shown[0]["tokens_used"] is None


async def test_held_jobs_count_towards_the_lines_bound(make_replica: ClientFactory, redis: Redis) -> None:
    # Given key a with one live run at a time, the line bounded at 3, a's first run live and 3 more held
    quotas = Quotas(keys=(("a", Quota(live=1)),))
    replica = await make_replica(hermes_max_concurrent=4, admission_quotas=quotas, admission_max_waiting=3)
    await _one_live_three_held(replica, redis)
    # When another key creates while the line itself is empty
    answer = await replica.post("/v1/runs", json={"input": "b 1", "scheduling": {"fairness_key": "b"}})
    # Then it is refused: the held jobs wait too
    body = await answer.json()
    assert answer.status == 429 and "ADMISSION_MAX_WAITING" in body["error"]["message"]


async def _one_live_three_held(replica: Client, redis: Redis) -> None:
    """Key a's first run live (out of the line) and its next three jobs held by its live quota of 1."""
    first = await submit(replica, "a 0 sleep:3", key="a")
    await eventually(lambda: _running(replica, first))
    for i in range(1, 4):
        await submit(replica, f"a {i}", key="a")
    await eventually(lambda: _held(redis, "a", 3))


async def _running(client: Client, job_id: str) -> bool:
    return (await job(client, job_id))["status"] == "running"


async def _held(redis: Redis, key: str, count: int) -> bool:
    return await redis.zcard(keys.quota_held(key)) == count


async def test_a_long_wait_for_a_quota_does_not_count_towards_runs_hold(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given RUNS_HOLD of 1.5 s, key a with one live run at a time: a 4 s run live and a second job held behind it
    quotas = Quotas(keys=(("a", Quota(live=1)),))
    replica = await make_replica(hermes_max_concurrent=4, admission_quotas=quotas, runs_hold_ms=1_500)
    first = await submit(replica, "a 0 sleep:4", key="a")
    second = await submit(replica, "a 1", key="a")

    async def running() -> bool:
        return (await job(replica, first))["status"] == "running"

    await eventually(running)
    # When Hermes answers 429 to creates by the time the first run ends, 4 s after the second was created
    sim.settings.busy = True
    await settled(replica, first)

    async def held_busy() -> dict[str, Any] | None:
        current = await job(replica, second)
        refused = current["last_event"] == "job.held"  # Hermes's 429 to its own create, recorded
        return current if current["status"] != "queued" or refused else None

    # Then the second waits for Hermes from its grant, not from its create: held busy, not failed hold_expired
    shown = await eventually(held_busy)
    assert shown["status"] == "queued", shown
    assert shown["hold"]["since"] > shown["created_at"] + 3
    # And it runs once Hermes takes creates again
    sim.settings.busy = False
    assert (await settled(replica, second))["status"] == "completed"
