"""Quotas (SPEC S4.4) in their hard moments: stops, wakes that come late, views gone, replicas racing over a budget,
many keys, a key whose budget allows again; real Redis and HTTP, the simulator in-process."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.admission.quotas import Quota, Quotas
from broker.simulator.state import Simulator
from broker.store import keys
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import eventually, job, settled
from tests.integration.driver.test_admission import create_keys
from tests.integration.driver.test_fairness import submit

Client = TestClient[Any, Any]


async def _held(redis: Redis, key: str, count: int) -> bool:
    return await redis.zcard(keys.quota_held(key)) == count


@BOTH_BACKENDS
async def test_a_job_held_by_its_quota_longer_than_runs_hold_runs_when_its_turn_comes(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    """A job held by its key's quota longer than RUNS_HOLD runs when its key has room: the quota's wait is the broker's
    own and does not count towards RUNS_HOLD (S3.2)."""
    # Given key a with a live quota of 1, RUNS_HOLD 2 s, a first run of 3.5 s and a second job held behind it
    quotas = Quotas(keys=(("a", Quota(live=1)),))
    replica = await make_replica(hermes_max_concurrent=4, admission_quotas=quotas, runs_hold_ms=2_000)
    first = await submit(replica, "a 0 sleep:3.5", key="a")
    second = await submit(replica, "a 1", key="a")
    await eventually(lambda: _held(redis, "a", 1))
    # When the first settles, after the second waited for its quota longer than RUNS_HOLD (Hermes never refused it)
    assert (await settled(replica, first, timeout=30))["status"] == "completed"
    done = await settled(replica, second, timeout=30)
    # Then the second runs: its quota wait is no hold RUNS_HOLD expires
    assert done["status"] == "completed", done["error"]
    assert second in create_keys(sim)


async def test_stopped_held_jobs_stop_counting_against_the_keys_waiting_quota(
    make_replica: ClientFactory, redis: Redis
) -> None:
    """A held job that is stopped leaves its key's held jobs at once: it no longer counts against the key's `waiting`
    quota, nor shows as held."""
    # Given key a with one live run (a long one) and at most 2 waiting jobs, and 2 more held
    quotas = Quotas(keys=(("a", Quota(live=1, waiting=2)),))
    replica = await make_replica(hermes_max_concurrent=4, admission_quotas=quotas)
    running = await submit(replica, "a 0 sleep:8", key="a")
    await eventually(lambda: _status(replica, running, "running"))
    held = [await submit(replica, f"a {i}", key="a") for i in (1, 2)]
    await eventually(lambda: _held(redis, "a", 2))
    # When both held jobs are stopped (cancelled at once)
    for job_id in held:
        assert (await replica.post(f"/v1/runs/{job_id}/stop")).status == 200
        assert (await job(replica, job_id))["status"] == "cancelled"
    # Then a new job of a is taken: nothing of a waits any more
    answer = await replica.post("/v1/runs", json={"input": "a 3", "scheduling": {"fairness_key": "a"}})
    assert answer.status == 202, await answer.text()


async def _status(client: Client, job_id: str, status: str) -> bool:
    return bool((await job(client, job_id))["status"] == status)


async def test_a_token_budget_crossed_with_two_replicas_overshoots_at_most_the_runs_live_at_the_crossing(
    make_client: ClientFactory, make_replica: ClientFactory, sim: Simulator
) -> None:
    """With two replicas granting, a key's settled tokens pass its budget by at most what its runs live at the crossing
    used (S4.4)."""
    quotas = Quotas(keys=(("a", Quota(tokens=3_000, window="1h")),))
    client = await make_client(admission_quotas=quotas)
    a = [await submit(client, f"a {i} tokens:600 sleep:{0.1 + 0.1 * (i % 4)}", key="a") for i in range(30)]
    for _ in range(3):
        await make_replica(hermes_max_concurrent=3, admission_quotas=quotas)

    async def budget_holds() -> bool:
        holds = [(await job(client, job_id))["hold"] for job_id in a]
        return any(h is not None and h["reason"] == "budget" for h in holds)

    await eventually(budget_holds, timeout=30)
    await asyncio.sleep(2.0)  # anything granted on a stale read has started by now
    mine = set(a)
    runs = [
        sim.runs[str(r["run_id"])]
        for r in sim.requests
        if r["method"] == "POST" and r["path"] == "/v1/runs" and r.get("run_id") and r["idempotency_key"] in mine
    ]
    # five runs of 600 settled, by the broker's record (it counts a run's tokens just after its last write): 3,000
    views = [await job(client, job_id) for job_id in a]
    crossing = sorted(view["updated_at"] for view in views if view["status"] == "completed")[4]
    late = [run.created_at - crossing for run in runs if run.created_at > crossing + 0.3]
    assert not late, f"{len(late)} of {len(runs)} runs started after the crossing (s after it: {late})"


async def test_a_replica_grants_on_its_stale_read_of_a_budget_another_replica_crossed(redis: Redis) -> None:
    """A replica reads a key's token use afresh for every take: once another replica counted the run that crossed the
    budget, neither grants the key's next job."""
    from broker.store.quota import QuotaStore
    from broker.store.usage import UsageStore
    from projections.usage import Used

    quotas = Quotas(keys=(("a", Quota(tokens=1_000, window="1h")),))
    usage = UsageStore(redis, retention_ms=86_400_000)
    x, y = QuotaStore(redis, quotas, usage), QuotaStore(redis, quotas, usage)
    now = int(time.time() * 1000)
    # Given X granted a's first job on a read of 0 tokens used
    assert (await x.take([("job_x1", "a", "1")], now, 15_000)).held == set()
    # When a's runs settle at 1,200 tokens, counted by the replica that released them (Y)
    fact = Used(marker="job_y0:end", key="a", at_ms=now, total_tokens=1_200)
    await y.budgets.counted([fact for fact, new in zip([fact], await usage.count([fact]), strict=True) if new])
    # Then a's next job is held, whichever replica's pass claims it (Y holds it; X takes it live)
    assert (await x.take([("job_x2", "a", "2")], now + 200, 15_000)).held == {"job_x2"}, "X granted over the budget"
    assert (await y.take([("job_y3", "a", "3")], now + 300, 15_000)).held == {"job_y3"}


async def test_a_woken_job_that_waits_in_line_is_counted_twice_against_the_waiting_quota(
    make_replica: ClientFactory, redis: Redis
) -> None:
    """A held job sent back to the line counts once against its key's `waiting` quota (in the line, no longer as held),
    also while it waits there for a full Hermes."""
    # Given Hermes with room for 2, key a with a live quota of 1 and a waiting quota of 3
    quotas = Quotas(keys=(("a", Quota(live=1, waiting=3)),))
    replica = await make_replica(hermes_max_concurrent=2, admission_quotas=quotas)
    first = await submit(replica, "a 0 sleep:2", priority=5, key="a")
    await eventually(lambda: _status(replica, first, "running"))
    held = [await submit(replica, f"a {i}", priority=5, key="a") for i in (1, 2)]
    await eventually(lambda: _held(redis, "a", 2))
    # And key b's long runs (priority 1) that take Hermes's other slot, then the one a's first run frees
    b = [await submit(replica, f"b {i} sleep:10", priority=1, key="b") for i in range(2)]
    await eventually(lambda: _status(replica, b[0], "running"))
    assert (await settled(replica, first, timeout=15))["status"] == "completed"
    await eventually(lambda: _status(replica, b[1], "running"))
    await asyncio.sleep(0.5)  # a's key was looked at: its first held job is back in line (and still held)
    assert [(await job(replica, job_id))["status"] for job_id in held] == ["queued", "queued"]
    # When a creates a third waiting job (2 wait: its quota is 3)
    answer = await replica.post("/v1/runs", json={"input": "a 3", "scheduling": {"fairness_key": "a", "priority": 5}})
    # Then it is taken
    assert answer.status == 202, await answer.text()


async def test_a_create_under_admission_max_waiting_costs_a_bounded_number_of_redis_calls(
    make_client: ClientFactory, redis: Redis
) -> None:
    """With ADMISSION_MAX_WAITING a create reads the count of every held job in one call, whatever keys hold jobs."""
    quotas = Quotas(default=Quota(live=1))
    client = await make_client(admission_quotas=quotas, admission_max_waiting=1_000_000)
    count = 5_000
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(count):
            pipe.zadd(keys.QUOTA_HELD_KEYS, {f"k{i}": 2**52})
            pipe.zadd(keys.quota_held(f"k{i}"), {f"job_fake{i}": 1})
        await pipe.execute()

    async def zcards() -> int:
        stats = await redis.info("commandstats")
        return int(stats.get("cmdstat_zcard", {}).get("calls", 0))

    before = await zcards()
    answer = await client.post("/v1/runs", json={"input": "x", "scheduling": {"fairness_key": "new"}})
    assert answer.status == 202
    used = await zcards() - before
    # each partition's line and parked jobs (ADMISSION_FAIRNESS_COST time parks a key's later jobs): never one per key
    assert used <= 2 * keys.PARTITIONS + 4, f"one create made {used} ZCARD calls"


async def test_stopped_held_jobs_at_the_front_do_not_stall_their_key(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    """Stopped jobs at the front of a key's held jobs do not stall it: when the key has room its next real job starts at
    once."""
    quotas = Quotas(keys=(("a", Quota(live=1)),))
    replica = await make_replica(hermes_max_concurrent=4, admission_quotas=quotas)
    first = await submit(replica, "a 0 sleep:1", key="a")
    await eventually(lambda: _status(replica, first, "running"))
    jobs = [await submit(replica, f"a {i}", key="a") for i in range(1, 5)]
    await eventually(lambda: _held(redis, "a", 4))
    for job_id in jobs[:3]:
        assert (await replica.post(f"/v1/runs/{job_id}/stop")).status == 200
    assert (await settled(replica, first, timeout=15))["status"] == "completed"
    freed = time.monotonic()
    # The last job starts soon after the key's run settled: nothing else of a is live or waiting
    await eventually(lambda: _started(sim, jobs[3]), timeout=30)
    waited = time.monotonic() - freed
    assert waited < 3, f"a's only waiting job started {waited:.1f} s after its key had room"


async def _started(sim: Simulator, job_id: str) -> bool:
    return job_id in create_keys(sim)


async def test_a_late_wake_never_puts_a_running_job_back_in_the_line(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    """A wake that comes late (another replica took the woken job meanwhile and runs it) never puts the running job back
    in the line."""
    from broker.http.appkeys import admission_key

    quotas = Quotas(keys=(("a", Quota(live=2)),))
    x = await make_replica(hermes_max_concurrent=4, admission_quotas=quotas)
    y = await make_replica(hermes_max_concurrent=4, admission_quotas=quotas)
    quota_y = y.app[admission_key].quota
    assert quota_y is not None
    original = quota_y.wake

    async def stalled_wake(now_ms: int, **options: Any) -> list[tuple[str, str]]:
        back: list[tuple[str, str]] = await original(now_ms, **options)
        if back:
            await asyncio.sleep(2.5)  # a stall between the wake script and the re-entries (> ADMIT_TICK_S)
        return back

    quota_y.wake = stalled_wake
    jobs = [await submit(x if i % 2 else y, f"a {i} sleep:{1 + i % 3}", key="a") for i in range(10)]
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        views = [await job(x, job_id) for job_id in jobs]
        for view in views:
            if view["status"] == "running":
                place = await redis.zscore(keys.line(keys.partition_of(view["run_id"])), view["run_id"])
                if place is not None:
                    seen.add(view["run_id"])
        if all(view["status"] == "completed" for view in views):
            break
        await asyncio.sleep(0.02)
    assert not seen, f"running jobs found in the admission line: {sorted(seen)}"


async def test_readyz_with_default_weekly_budgets_answers_quickly(make_client: ClientFactory, redis: Redis) -> None:
    """/readyz with a default weekly budget and 50 keys holding jobs reads each key's token use in one call (not one per
    hour of the window)."""
    quotas = Quotas(default=Quota(tokens=1_000_000, window="7d"))
    client = await make_client(admission_quotas=quotas)
    async with redis.pipeline(transaction=False) as pipe:
        for i in range(50):
            pipe.zadd(keys.QUOTA_HELD_KEYS, {f"k{i}": 2**52})
            pipe.zadd(keys.quota_held(f"k{i}"), {f"job_fake{i}": 1})
        await pipe.execute()

    await client.get("/readyz")  # warm
    before = await _hash_reads(redis)
    answer = await client.get("/readyz")
    assert answer.status in (200, 503)
    used = await _hash_reads(redis) - before
    assert used <= 200, f"a /readyz made {used} hash reads"


async def test_a_held_job_whose_view_is_gone_does_not_strand_its_key(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    """A held job whose view is gone (expired past RUNS_RETENTION, or a restored store) is forgotten when its key has
    room, and the key's next jobs run."""
    quotas = Quotas(keys=(("a", Quota(live=1)),))
    replica = await make_replica(hermes_max_concurrent=4, admission_quotas=quotas)
    first = await submit(replica, "a 0 sleep:1", key="a")
    await eventually(lambda: _status(replica, first, "running"))
    second = await submit(replica, "a 1", key="a")
    await eventually(lambda: _held(redis, "a", 1))
    # Given a held job of a, ahead of a's second, whose view is gone
    place = await redis.zscore(keys.quota_held("a"), second)
    assert place is not None
    await redis.zadd(keys.quota_held("a"), {"job_" + "0" * 31 + "1": place - 1})
    # When a's run settles, the key has room
    assert (await settled(replica, first, timeout=15))["status"] == "completed"
    # Then a's second job runs
    done = await settled(replica, second, timeout=25)
    assert done["status"] == "completed", done


async def test_a_job_counts_once_against_its_quota_when_it_is_taken_again(redis: Redis) -> None:
    """A job taken again while its live entry stands counts once: it is not held behind itself."""
    from broker.store.quota import QuotaStore

    quotas = Quotas(keys=(("a", Quota(live=1)),))
    x, y = QuotaStore(redis, quotas), QuotaStore(redis, quotas)
    now = int(time.time() * 1000)
    assert (await x.take([("job_a0", "a", "1")], now, 15_000)).held == set()
    # The same job granted again (handed back, re-queued) by another replica: nothing else of a is live
    assert (await y.take([("job_a0", "a", "1")], now + 500, 15_000)).held == set(), "the job is held by its own entry"


async def test_a_job_handed_back_mid_create_by_a_draining_replica_starts_at_once_elsewhere(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    """A draining replica hands back a job whose create was in flight, and its live entry with it: another replica
    starts it at once."""
    quotas = Quotas(keys=(("a", Quota(live=1)),))
    sim.settings.delay_s = 1.5  # Hermes answers creates slowly
    sim.settings.upstream_main = True  # and honours Idempotency-Key
    leaving = await make_replica(hermes_max_concurrent=4, admission_quotas=quotas, runs_lease_ms=10_000)
    first = await submit(leaving, "a 0", key="a")
    await eventually(lambda: _entry(redis, "a", first))  # granted, its create in flight
    staying = await make_replica(hermes_max_concurrent=4, admission_quotas=quotas, runs_lease_ms=10_000)
    await asyncio.sleep(0.3)
    await leaving.close()  # drains: hands its jobs back
    handed = time.monotonic()
    done = await settled(staying, first, timeout=40)
    took = time.monotonic() - handed
    assert done["status"] == "completed"
    assert took < 6, f"the handed-back job completed {took:.1f} s after the drain"


async def _entry(redis: Redis, key: str, job_id: str) -> bool:
    return await redis.zscore(keys.quota_live(key), job_id) is not None


async def test_a_key_whose_budget_allows_again_does_not_starve_a_waiting_backlog(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    """A key whose budget allows runs again re-enters the line at its current virtual time, one turn per job: a
    backlogged key keeps its share of the grants meanwhile (S4.2: an idle key banks nothing). The window's passing
    is played by clearing the key's hour of tokens."""
    replica = await make_replica(hermes_max_concurrent=2, admission_quotas=BUDGET_A)
    b_share = await share_while_a_returns(replica, sim, redis)
    assert b_share >= 0.3, f"b got {b_share:.0%} of the grants while a's held backlog returned"


BUDGET_A = Quotas(keys=(("a", Quota(tokens=1_000, window="1h")),))


async def share_while_a_returns(
    replica: Client, sim: Simulator, redis: Redis, then: Callable[[], Awaitable[object]] | None = None
) -> float:
    """Key b's share of the grants made while key a's 12 jobs, held by a's budget behind b's backlog of 40 runs (two
    at a time), return once a's hour of tokens is gone (and `then` ran: another replica starts, say)."""
    from broker.store.usage import hour_of

    hour = str(hour_of(int(time.time() * 1000)))
    await redis.hincrby(keys.quota_tokens("a"), hour, 5_000)  # a's settled runs' tokens this hour
    a = [await submit(replica, f"a {i} sleep:0.2", key="a") for i in range(12)]
    await eventually(lambda: _held(redis, "a", 12))
    b = [await submit(replica, f"b {i} sleep:0.2", key="b") for i in range(40)]
    await eventually(lambda: _count_started(sim, b, 16), timeout=30)
    await redis.hdel(keys.quota_tokens("a"), hour)
    await redis.zadd(keys.QUOTA_HELD_KEYS, {"a": 0})
    mark = len(create_keys(sim))
    if then is not None:
        await then()
    await eventually(lambda: _count_started(sim, a, 12), timeout=30)
    after = create_keys(sim)[mark:]
    first_dozen_of_a = after[: after.index(a[-1]) + 1]
    return sum(1 for job_id in first_dozen_of_a if job_id in b) / len(first_dozen_of_a)


async def _count_started(sim: Simulator, job_ids: list[str], count: int) -> bool:
    mine = set(job_ids)
    return sum(1 for job_id in create_keys(sim) if job_id in mine) >= count


async def test_a_woken_job_waiting_for_hermes_does_not_show_its_key_at_its_quota(
    make_replica: ClientFactory, redis: Redis
) -> None:
    """A job sent back to the line that waits for a full Hermes shows the line's hold (`busy`), not its key's quota."""
    quotas = Quotas(keys=(("a", Quota(live=1)),))
    replica = await make_replica(hermes_max_concurrent=2, admission_quotas=quotas)
    first = await submit(replica, "a 0 sleep:2", priority=5, key="a")
    await eventually(lambda: _status(replica, first, "running"))
    second = await submit(replica, "a 1", priority=5, key="a")
    await eventually(lambda: _held(redis, "a", 1))
    b = [await submit(replica, f"b {i} sleep:10", priority=1, key="b") for i in range(2)]
    await eventually(lambda: _status(replica, b[0], "running"))
    assert (await settled(replica, first, timeout=15))["status"] == "completed"
    await eventually(lambda: _status(replica, b[1], "running"))
    await asyncio.sleep(0.5)
    assert await redis.zcount(keys.quota_live("a"), int(time.time() * 1000), "+inf") == 0  # nothing of a is live
    hold = (await job(replica, second))["hold"]
    assert hold is None or hold["reason"] != "quota", hold


async def test_a_pass_of_many_keys_with_a_default_weekly_budget_reads_their_use_at_once(redis: Redis) -> None:
    """A pass granting jobs of 100 keys under a default weekly budget reads their token use with one call per key, in
    one round trip."""
    from broker.store.quota import QuotaStore
    from broker.store.usage import UsageStore

    quotas = Quotas(default=Quota(tokens=1_000_000, window="7d"))
    store = QuotaStore(redis, quotas, UsageStore(redis, retention_ms=86_400_000 * 8))
    now = int(time.time() * 1000)

    before = await _hash_reads(redis)
    taken = await store.take([(f"job_{i}", f"k{i}", str(2**52 + i)) for i in range(100)], now, 15_000)
    used = await _hash_reads(redis) - before
    assert taken.held == set()
    assert used <= 200, f"a take of 100 keys made {used} hash reads"


async def _hash_reads(redis: Redis) -> int:
    """HGET and HMGET calls the session's Redis answered so far."""
    stats = await redis.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in ("hget", "hmget"))
