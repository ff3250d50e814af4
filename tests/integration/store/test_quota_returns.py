"""A key's order under a live quota (SPEC S4.2 "FIFO within a key", S4.4) for jobs that come back to the line by
other ways than their quota (a session's or an upstream's wait, a takeover), a hand-back's wait for Hermes (RUNS_HOLD,
S3.2), and a saturated band. Real Redis."""

from __future__ import annotations

import time

from redis.asyncio import Redis

from broker.admission import fair
from broker.admission.fair import UNIT
from broker.admission.quotas import Quota, Quotas
from broker.admission.state import line_place
from broker.driver import decide
from broker.driver.decide import Submit
from broker.events import JobCreated
from broker.jobs.policy import Policy
from broker.store import keys
from broker.store.quota import QuotaStore
from projections.job import apply

TTL_MS = 60_000
P3 = fair.front(3)  #: the front of priority 3's band: where a first attempt whose line place is lost goes (line_place)
QUOTAS = Quotas(keys=(("a", Quota(live=1)),))


def _at(tag_units: int) -> str:
    return str(P3 + tag_units * UNIT)


async def test_a_turn_back_from_waiting_for_its_session_starts_before_its_keys_later_job(redis: Redis) -> None:
    """S4.2: "a job that waits for its own upstream or session keeps its priority band and its place among its key's
    jobs". A granted turn whose session is busy gives its grant back with a plain release (supervisor
    PARKED_FOR_SESSION), not `returned`: it is neither held nor woken. When its session frees it goes back to the line
    at its own place, ahead of its key's later job that the quota held meanwhile and woke: it starts first."""
    store = QuotaStore(redis, QUOTAS)
    now = int(time.time() * 1000)
    # Given a's first job granted (counted live) and its second held at a's quota of 1
    assert (await store.take([("job_1", "a", _at(1))], now, TTL_MS)).held == set()
    assert (await store.take([("job_2", "a", _at(2))], now + 10, TTL_MS)).held == {"job_2"}
    # When the first's session is busy: its runner parks it for its session and releases its grant
    await store.release("job_1")
    # And a's room wakes the second (back to the line)
    assert [job_id for job_id, _, _ in await store.wake(now + 100)] == ["job_2"]
    # And the first's session frees: it is back in the line at its own place, ahead of the second; a pass grants both
    decided = await store.take([("job_1", "a", _at(1)), ("job_2", "a", _at(2))], now + 200, TTL_MS)
    # Then the first starts, and the second (arrived later) waits
    assert decided.held == {"job_2"}, f"a's later job started before its earlier one (held: {set(decided.held)})"


async def test_a_job_back_from_waiting_for_its_upstream_starts_before_its_keys_later_job(redis: Redis) -> None:
    """S4.2/S10: a granted job routed nowhere (its session's upstream is busy) is not taken and goes back to the line
    (its runner's Queue: line_place, the front of its band) keeping its place among its key's jobs. Meanwhile its key's
    next job was granted and held at the quota, then woken. The first, granted again, starts before the second."""
    store = QuotaStore(redis, QUOTAS)
    now = int(time.time() * 1000)
    # Given a's job_0 live
    assert (await store.take([("job_0", "a", _at(0))], now, TTL_MS)).held == set()
    # And job_1 granted but routed nowhere (never taken), back in the line at the front of its band
    # And job_2, a's next front, granted and held at a's quota
    assert (await store.take([("job_2", "a", _at(2))], now + 10, TTL_MS)).held == {"job_2"}
    # When job_0 settles and a's room wakes job_2
    await store.release("job_0")
    assert [job_id for job_id, _, _ in await store.wake(now + 100)] == ["job_2"]
    # And a pass grants the line's heads: job_1 (front of the band), then job_2
    decided = await store.take([("job_1", "a", str(P3)), ("job_2", "a", _at(2))], now + 200, TTL_MS)
    # Then job_1 starts, and job_2 (arrived later) waits
    assert decided.held == {"job_2"}, f"a's later job started before its earlier one (held: {set(decided.held)})"


async def test_a_job_taken_over_before_its_create_keeps_its_place_ahead_of_its_keys_held_job(redis: Redis) -> None:
    """A replica that granted a's first job (counted live) dies before its create: another replica takes the job
    over after RUNS_LEASE, finds it queued without a slot and puts it back in the line at line_place (the front of
    its band). No `returned` ran (the dead replica's memory is gone): it is taken again, ahead of a's second job,
    which the quota held behind it."""
    dead = QuotaStore(redis, QUOTAS)
    now = int(time.time() * 1000)
    # Given a's first job granted by a replica (counted live) and a's second held behind it
    assert (await dead.take([("job_1", "a", _at(1))], now, TTL_MS)).held == set()
    assert (await dead.take([("job_2", "a", _at(2))], now + 10, TTL_MS)).held == {"job_2"}
    # When that replica dies before creating the run, and another takes the job over and back to the line
    other = QuotaStore(redis, QUOTAS)
    decided = await other.take([("job_1", "a", str(P3))], now + 20_000, TTL_MS)
    # Then the first job is taken again (it is a's earliest), not held behind the job that arrived after it
    assert decided.held == set(), "a's first job, taken over, is held behind its second"
    # (and, as it is, a's room goes to the second, which is woken and starts before the first)


async def test_a_grant_handed_back_before_hermes_answered_keeps_its_wait_for_hermes_from_its_quota_hold_end(
    redis: Redis,
) -> None:
    """S3.2: "only Hermes's refusals count toward RUNS_HOLD". A job its quota held longer than RUNS_HOLD is taken
    (`waited`: its wait for Hermes begins then). Its grant goes back before Hermes answered (a drain hands it back, or
    its runner failed: requeue -> returned), with no refusal recorded (no `hold` on the job). The pass that takes it
    again reports it `waited`, so its new runner counts its wait from then, not from the job's create."""
    policy = Policy(hold_ms=10_000)
    store = QuotaStore(redis, QUOTAS)
    now = int(time.time() * 1000)
    job_id = "job_" + "0" * 32
    created = apply(None, JobCreated(job_id=job_id, at_ms=now, body="{}", fingerprint="f"))
    assert created is not None
    # Given a's job_0 live and the job held behind it at a's quota, for longer than RUNS_HOLD
    assert (await store.take([("job_0", "a", _at(0))], now, TTL_MS)).held == set()
    assert (await store.take([(job_id, "a", _at(1))], now + 10, TTL_MS)).held == {job_id}
    later = now + 60_000
    await store.release("job_0")
    assert [j for j, _, _ in await store.wake(later)] == [job_id]
    taken = await store.take([(job_id, "a", _at(1))], later + 10, TTL_MS)
    assert taken.waited == {job_id}  # its wait for Hermes begins now
    assert isinstance(decide.next_action(created, later + 20, stop_sent=False, admitted=True, policy=policy,
                                         turn_since_ms=later + 10), Submit)  # fmt: skip
    # When its grant is handed back before Hermes answered (a drain: requeue), and a pass takes it again
    await store.returned(job_id, line_place(created), refused=False)
    assert [j for j, _, _ in await store.wake(later + 1_000)] == [job_id]
    again = await store.take([(job_id, "a", _at(1))], later + 1_100, TTL_MS)
    assert again.held == set()
    waited_until = later + 1_100 if job_id in again.waited else 0  # AdmissionStore.admit: Grant.waited_until_ms
    # Then its new runner submits it (its wait for Hermes began 1 s ago, not 61 s ago)
    action = decide.next_action(
        created, later + 1_200, stop_sent=False, admitted=True, policy=policy, turn_since_ms=waited_until
    )
    assert isinstance(action, Submit), f"a job Hermes never refused expired: {action}"


async def test_a_new_job_held_behind_a_saturated_tag_stays_in_its_priority_band(redis: Redis) -> None:
    """fair.py: tags saturate at MAX_TAG "rather than spill into the next priority", so a key's jobs can share the
    band's last tag. A new job held behind its band's last held job stays in its band (not at the next, less urgent
    band's front)."""
    store = QuotaStore(redis, QUOTAS)
    now = int(time.time() * 1000)
    last = str(fair.score(3, fair.MAX_TAG))
    assert (await store.take([("job_1", "a", last)], now, TTL_MS)).held == set()
    assert (await store.take([("job_2", "a", last)], now + 10, TTL_MS, new=["job_2"])).held == {"job_2"}
    assert (await store.take([("job_3", "a", last)], now + 20, TTL_MS, new=["job_3"])).held == {"job_3"}
    place = await redis.zscore(keys.quota_held("a"), "job_3")
    assert place is not None
    band = fair.band_of(place)
    assert band is not None and band[0] == 3, f"a priority-3 job is held at {int(place)}: priority {band}"
