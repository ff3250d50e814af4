"""Quotas (SPEC S4.4) against S4.2's order rules and S3.2's holds: a key's jobs in arrival order and strict priority
while some of them are held or sent back to the line; the hold a held job shows; real Redis, the simulator
in-process."""

from __future__ import annotations

import time
from typing import Any

from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.admission.fair import UNIT
from broker.admission.quotas import Quota, Quotas
from broker.simulator.state import Simulator
from broker.store import keys
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import eventually, job, settled
from tests.integration.driver.test_admission import create_keys
from tests.integration.driver.test_fairness import submit
from tests.integration.driver.test_quotas_faults import BUDGET_A, share_while_a_returns

Client = TestClient[Any, Any]
BAND = 2**52  # a place in a priority band (>= 2^51), as the tests of broker/store/quota.py use


async def _held(redis: Redis, key: str, count: int) -> bool:
    return await redis.zcard(keys.quota_held(key)) == count


async def _status(client: Client, job_id: str, status: str) -> bool:
    return bool((await job(client, job_id))["status"] == status)


async def _started(sim: Simulator, job_id: str) -> bool:
    return job_id in create_keys(sim)


@BOTH_BACKENDS
async def test_a_keys_urgent_job_is_not_passed_over_for_other_keys_less_urgent_jobs_while_its_key_has_room(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    """Strict priority (S4.2) holds with quotas (S4.4): a priority-1 job of a key below its `live` quota starts at the
    next free slot, before other keys' priority-3 jobs, whatever less urgent jobs of its own key wait in the line."""
    # Given key a with a live quota of 1 and Hermes with room for 2
    quotas = Quotas(keys=(("a", Quota(live=1)),))
    replica = await make_replica(hermes_max_concurrent=2, admission_quotas=quotas)
    first = await submit(replica, "a 0 sleep:2", priority=3, key="a")
    await eventually(lambda: _status(replica, first, "running"))
    # And a's priority-5 job held behind it
    low = await submit(replica, "a 1", priority=5, key="a")
    await eventually(lambda: _held(redis, "a", 1))
    # And b's priority-3 backlog: one short run, then long ones
    b = [await submit(replica, "b 0 sleep:5", priority=3, key="b")]
    b += [await submit(replica, f"b {i} sleep:30", priority=3, key="b") for i in range(1, 6)]
    await eventually(lambda: _status(replica, b[0], "running"))
    # When a's run settles (a has no live run: its priority-5 job goes back to the line, behind b's backlog)
    assert (await settled(replica, first, timeout=15))["status"] == "completed"
    await eventually(lambda: _status(replica, b[1], "running"))
    # And a creates a priority-1 job while Hermes is full
    urgent = await submit(replica, "a 2", priority=1, key="a")

    # Then a's priority-1 job starts at the next free slot (b's short run settles), before b's next priority-3 job
    async def either() -> bool:
        return await _started(sim, urgent) or await _started(sim, b[2])

    await eventually(either, timeout=20)
    order = [job_id for job_id in create_keys(sim) if job_id in (urgent, b[2])]
    assert order[0] == urgent, (
        f"a's priority-1 job was passed over for b's priority-3 job (a had no live run; its own priority-5 job "
        f"{low} waits in line); hold shown: {(await job(replica, urgent))['hold']}"
    )


async def test_a_job_sent_back_to_the_line_and_held_again_keeps_its_turn_ahead_of_its_keys_later_jobs(
    redis: Redis,
) -> None:
    """A key's jobs start in arrival order (S4.2) whatever its budget does (S4.4): a held job sent back to the line
    and held again (its key's budget crossed meanwhile) goes back ahead of the key's jobs created after it."""
    from broker.store.quota import QuotaStore
    from broker.store.usage import UsageStore, hour_of

    quotas = Quotas(keys=(("a", Quota(tokens=1_000, window="1h")),))
    store = QuotaStore(redis, quotas, UsageStore(redis, retention_ms=86_400_000))
    now = int(time.time() * 1000)
    hour = str(hour_of(now))
    await redis.hincrby(keys.quota_tokens("a"), hour, 5_000)
    # Given a's first two jobs (arrival order 1, 2) held by a's budget
    assert (
        await store.take([("job_1", "a", str(BAND + 1 * UNIT)), ("job_2", "a", str(BAND + 2 * UNIT))], now, 15_000)
    ).held == {
        "job_1",
        "job_2",
    }
    # When the budget allows again: both are sent back to the line, re-placed at the line's virtual time (V), a turn
    # apart (AdmissionStore._returned_place: V + 0, V + 1 turn)
    await redis.hdel(keys.quota_tokens("a"), hour)
    await redis.zadd(keys.QUOTA_HELD_KEYS, {"a": 0})
    back = await store.wake(now + 1_000)
    assert [job_id for job_id, _, _ in back] == ["job_1", "job_2"]
    v = BAND + 50 * UNIT  # the line's V moved on while a was held (other keys' grants)
    # And a's third job arrives now, at V (its key's turn is behind V), between the two re-placed ones
    # And a pass claims job_1 (V): taken; its run crosses the budget again
    assert (await store.take([("job_1", "a", str(v))], now + 2_000, 15_000)).held == set()
    # The pass claims job_3 (V + a fraction of a turn, after job_1): held behind a's woken job_2 (never held before)
    assert (await store.take([("job_3", "a", str(v + UNIT // 2))], now + 2_100, 15_000)).held == {"job_3"}
    await redis.hincrby(keys.quota_tokens("a"), hour, 5_000)
    # And claims job_2 (V + 1 turn): over the budget, held again
    assert (await store.take([("job_2", "a", str(v + UNIT))], now + 2_200, 15_000)).held == {"job_2"}
    # Then when the budget allows again, job_2 goes back ahead of job_3 (it arrived first)
    await redis.hdel(keys.quota_tokens("a"), hour)
    await redis.zadd(keys.QUOTA_HELD_KEYS, {"a": 0})
    again = [job_id for job_id, _, _ in await store.wake(now + 5_000)]
    assert again == ["job_2", "job_3"], f"a's jobs go back to the line in the order {again}"


async def test_a_job_held_behind_its_keys_returned_jobs_shows_no_live_quota_its_key_is_not_at(redis: Redis) -> None:
    """A held job's hold tells the truth (S3.2): reason `quota` ("its key is at its `live` quota") only while its key
    is at its `live` quota; a key that has only a token budget, within it, never shows `quota`."""
    from broker.events import JobCreated, Scheduling
    from broker.store import quota_view
    from broker.store.quota import QuotaStore
    from broker.store.usage import UsageStore, hour_of
    from projections.job import fold

    quotas = Quotas(keys=(("a", Quota(tokens=1_000, window="1h")),))
    store = QuotaStore(redis, quotas, UsageStore(redis, retention_ms=86_400_000))
    now = int(time.time() * 1000)
    hour = str(hour_of(now))
    # Given a's first job held by a's budget, then sent back to the line when the budget allows
    await redis.hincrby(keys.quota_tokens("a"), hour, 5_000)
    assert (await store.take([("job_1", "a", str(BAND + UNIT))], now, 15_000)).held == {"job_1"}
    await redis.hdel(keys.quota_tokens("a"), hour)
    await redis.zadd(keys.QUOTA_HELD_KEYS, {"a": 0})
    assert [job_id for job_id, _, _ in await store.wake(now + 1_000)] == ["job_1"]
    # When a's second job is claimed before it (a more urgent one) and waits behind it
    second = "job_" + "2" * 32
    assert (await store.take([(second, "a", str(BAND + 2 * UNIT))], now + 1_100, 15_000)).held == {second}
    view = fold(
        [JobCreated(job_id=second, at_ms=now, body="{}", fingerprint="f", scheduling=Scheduling(fairness_key="a"))]
    )
    assert view is not None
    shown = (await quota_view.holds(store, [view], now + 1_200))[second]
    # Then its hold does not say that a is at a live quota (a has none, and no live run)
    assert shown.reason.value != "quota", f"a (a token budget only, within it) shows {shown}"


async def test_a_replica_that_just_started_returns_a_keys_held_backlog_at_the_lines_virtual_time(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    """A key whose budget allows again re-enters the line at the line's current virtual time (S4.2: an idle key banks
    nothing), whichever replica sends its held jobs back, also one that just started: a backlogged key keeps its share
    of the grants meanwhile."""
    from broker.http.appkeys import admission_key

    first = await make_replica(hermes_max_concurrent=2, admission_quotas=BUDGET_A)
    quota = first.app[admission_key].quota
    assert quota is not None

    async def no_wake(now_ms: int, **options: Any) -> list[tuple[str, str, str]]:
        return []

    quota.wake = no_wake  # this replica never sends a's jobs back: a new one does
    b_share = await share_while_a_returns(
        first, sim, redis, then=lambda: make_replica(hermes_max_concurrent=2, admission_quotas=BUDGET_A)
    )
    assert b_share >= 0.3, f"b got {b_share:.0%} of the grants while a's held backlog returned"


@BOTH_BACKENDS
async def test_a_fairness_key_named_like_the_held_counter_breaks_no_ones_quota(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    """Any valid fairness key (1-64 visible ASCII characters, S4.2; by default a caller's X-Hermes-Session-Key) is just
    a key: its jobs wait for its quota and run, and every other key's jobs keep running."""
    quotas = Quotas(default=Quota(live=1))
    replica = await make_replica(hermes_max_concurrent=4, admission_quotas=quotas)
    # Given key "#held" with a live quota of 1: a run and two jobs held behind it
    first = await submit(replica, "h 0 sleep:1", key="#held")
    await eventually(lambda: _status(replica, first, "running"))
    second = await submit(replica, "h 1 sleep:20", key="#held")
    await submit(replica, "h 2", key="#held")
    await eventually(lambda: _held(redis, "#held", 2))
    # When the first settles (the key has room: its next job runs) and key x creates jobs (x's live quota is 1 too)
    assert (await settled(replica, first, timeout=15))["status"] == "completed"
    await eventually(lambda: _status(replica, second, "running"))
    others = [await submit(replica, f"x {i} sleep:1", key="x") for i in range(3)]
    # Then every job runs
    for job_id in others:
        done = await settled(replica, job_id, timeout=15)
        assert done["status"] == "completed", (job_id, done)


async def test_a_job_sent_back_to_the_line_by_a_refusal_or_a_drain_keeps_its_turn_ahead_of_its_keys_held_jobs(
    redis: Redis,
) -> None:
    """A key's jobs start in arrival order (S4.2) under a `live` quota (S4.4): a job whose grant went back (Hermes
    refused it busy, or a draining replica handed it back mid-create) returns at its own place, ahead of the key's
    later jobs that its release let out of the held ones; it takes the key's room again, it is not held behind them.
    (End to end, with a drain mid-create, the second job started first in 1 run of 4.)"""
    from broker.store.quota import QuotaStore

    quotas = Quotas(keys=(("a", Quota(live=1)),))
    store = QuotaStore(redis, quotas)
    now = int(time.time() * 1000)
    # Given a's first job taken (live) and its second held behind it
    assert (await store.take([("job_1", "a", str(BAND + UNIT))], now, 15_000)).held == set()
    assert (await store.take([("job_2", "a", str(BAND + 2 * UNIT))], now + 100, 15_000)).held == {"job_2"}
    # When the first's grant goes back (a busy refusal, a requeue, a drain): no longer live, the key looked at
    await store.returned("job_1", str(BAND + UNIT), refused=True)
    back = await store.wake(now + 1_000)
    assert [job_id for job_id, _, _ in back] == ["job_1"]  # the key's room is the first's: its second stays held
    # And a pass claims the second at a place before the first's (a turn corrected since), then the first
    later = await store.take([("job_2", "a", str(BAND))], now + 1_100, 15_000)
    again = await store.take([("job_1", "a", str(BAND + UNIT))], now + 1_200, 15_000)
    # Then the first takes the key's room: it is not held behind the job that arrived after it
    assert later.held == {"job_2"}, "a's second job was taken ahead of its first, whose grant went back"
    assert again.held == set(), "a's first job is held behind its second"


async def test_a_key_whose_quota_is_taken_out_of_the_configuration_is_no_longer_looked_at_once_its_jobs_ran(
    redis: Redis,
) -> None:
    """A key whose quota an operator takes out of ADMISSION_QUOTAS (other keys keep theirs) leaves nothing behind: its
    held jobs go back to the line, and once they finished the broker stops looking at the key (no state kept, no
    re-entries every few seconds for ever)."""
    from broker.store.quota import RECHECK_MS, QuotaStore

    before = QuotaStore(redis, Quotas(keys=(("a", Quota(live=1)),)))
    now = int(time.time() * 1000)
    # Given a's job held behind its live run
    assert (await before.take([("job_1", "a", str(BAND + UNIT))], now, 15_000)).held == set()
    assert (await before.take([("job_2", "a", str(BAND + 2 * UNIT))], now + 100, 15_000)).held == {"job_2"}
    # When the replicas restart without a quota for a (b keeps one): a's held job goes back to the line
    after = QuotaStore(redis, Quotas(keys=(("b", Quota(live=1)),)))
    assert [job_id for job_id, _, _ in await after.wake(now + 1_000 + RECHECK_MS)] == ["job_2"]
    # And it runs and finishes (a pass claims it; a's jobs are no longer counted), its end heard as any held job's
    await after.forget([("job_2", "a")])
    # Then a is looked at no more: nothing of a is sent back again, and nothing of a is kept
    again = await after.wake(now + 2_000 + 3 * RECHECK_MS)
    assert again == [], f"a's finished job is sent back to the line again: {again}"
    assert await redis.zcard(keys.quota_woken("a")) == 0


async def test_a_live_run_renewed_in_the_millisecond_it_was_counted_is_still_released_at_its_end(redis: Redis) -> None:
    """A key's live run is released when it ends (its key's next job starts at once), however its renewals fell: one
    renewed in the same millisecond it was counted (its entry unchanged) is still the replica's to renew and
    release."""
    from broker.store.quota import QuotaStore

    store = QuotaStore(redis, Quotas(keys=(("a", Quota(live=1)),)))
    now = int(time.time() * 1000)
    # Given a's run counted live, and renewed (its slot's renewal) within the same millisecond
    assert (await store.take([("job_1", "a", str(BAND + UNIT))], now, 15_000)).held == set()
    await store.renew(["job_1"], now, 15_000)
    # When the run ends
    await store.release("job_1")
    # Then a's next job is taken at once (nothing of a is live)
    assert (await store.take([("job_2", "a", str(BAND + 2 * UNIT))], now + 100, 15_000)).held == set(), (
        "a's ended run still counts against its quota (until its entry lapses, 3 leases later)"
    )


async def test_a_job_hermes_keeps_refusing_expires_after_runs_hold_also_while_its_key_holds_jobs(
    make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    """RUNS_HOLD bounds how long Hermes's refusals may keep a job waiting (S3.2): a job Hermes refuses busy, again and
    again, fails with `hold_expired` about RUNS_HOLD after its first refusal, also when its key's quota holds it for a
    moment between refusals (that wait does not count, it does not start the count again)."""
    quotas = Quotas(keys=(("a", Quota(live=1)),))
    replica = await make_replica(hermes_max_concurrent=4, admission_quotas=quotas, runs_hold_ms=3_000)
    # Given Hermes refusing every create (busy), and key a's two jobs
    sim.settings.busy = True
    jobs = [await submit(replica, f"a {i}", key="a") for i in range(2)]
    # Then each fails with hold_expired within RUNS_HOLD and a few retries (not later)
    started = time.monotonic()
    for job_id in jobs:
        done = await settled(replica, job_id, timeout=25)
        assert done["status"] == "failed" and done["error"]["code"] == "hold_expired", done
    took = time.monotonic() - started
    assert took < 12, f"Hermes's refusals kept a's jobs waiting {took:.1f} s (RUNS_HOLD 3 s)"


async def test_a_keys_later_job_placed_before_its_held_one_by_a_corrected_turn_waits_behind_it(redis: Redis) -> None:
    """A key's jobs start in arrival order (S4.2) under a `live` quota (S4.4) when a turn costs Hermes time: a settle
    that corrects the key's charge down places its next job at a smaller tag than the job its quota holds, and that
    later job still waits behind the held one, held and woken in the key's order."""
    from broker.store.quota import QuotaStore

    store = QuotaStore(redis, Quotas(keys=(("a", Quota(live=1)),)))
    now = int(time.time() * 1000)
    # Given a's first job live, and its second held at the quota (charged the guess: a late tag)
    assert (await store.take([("job_1", "a", str(BAND + UNIT))], now, 15_000)).held == set()
    assert (await store.take([("job_2", "a", str(BAND + 600 * UNIT))], now + 10, 15_000)).held == {"job_2"}
    # When a's third job becomes its front at a corrected, smaller tag and a pass claims it
    third = await store.take([("job_3", "a", str(BAND + 20 * UNIT))], now + 20, 15_000, new=["job_3"])
    # Then it is held behind a's second (arrived first)
    assert third.held == {"job_3"}, "a's third job was taken ahead of its held second"
    # And when the first run ends, the second goes back to the line first, and is taken before the third
    await store.release("job_1")
    back = [job_id for job_id, _, _ in await store.wake(now + 1_000)]
    assert back[0] == "job_2", f"a's jobs go back to the line in the order {back}"
    assert (await store.take([("job_3", "a", str(BAND + 30 * UNIT))], now + 1_100, 15_000)).held == {"job_3"}
    assert (await store.take([("job_2", "a", str(BAND + 31 * UNIT))], now + 1_200, 15_000)).held == set()
