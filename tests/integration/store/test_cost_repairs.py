"""The cost scripts' idempotency and what a crash between two writes leaves (SPEC S4.2 "What a turn costs";
broker/store/cost_store.py): a second key step or settle of one attempt charges nothing, a placing is done again
harmlessly, and the state a crash leaves is the one the next call repairs."""

from __future__ import annotations

import time

import orjson
from redis.asyncio import Redis

from broker.admission import fair
from broker.admission.cost import CostSettings, History
from broker.store import keys, signals
from broker.store.connection import is_cluster
from broker.store.cost_store import CostStore, Front, Step
from broker.store.replies import text
from tests.conftest import BOTH_BACKENDS

pytestmark = BOTH_BACKENDS

KEY = "team-a"
P = 3
GUESS = 60_000


def _store(redis: Redis) -> CostStore:
    return CostStore(redis, CostSettings(guess=GUESS), 3_600_000)


async def _backlog(store: CostStore, redis: Redis, n: int) -> list[str]:
    """n jobs of KEY created at once: the first its front in the line, the others parked (as the job write would)."""
    jobs = [f"job_{i:032x}" for i in range(n)]
    for i, job in enumerate(jobs):
        placed = await store.enter(job, KEY, P, 1.0, 1_000 + i, 0, 0)
        where = keys.parked if placed.parked else keys.line
        await redis.zadd(where(keys.partition_of(job)), {job: fair.score(P, placed.tag)})
    return jobs


async def test_a_second_step_or_settle_of_one_attempt_charges_nothing(redis: Redis) -> None:
    # Given a backlog whose front a pass granted (charged the guess)
    store = _store(redis)
    jobs = await _backlog(store, redis, 3)
    first = await store.step(KEY, P, 1.0, 0, [Step(jobs[0])])
    assert first.charged == 1 and first.front is not None and first.front.placed.tag == GUESS
    # When the takeover runs the key step again, then the driver and the usage sweep both settle the run
    again = await store.step(KEY, P, 1.0, 0, [Step(jobs[0])])
    settled = await store.settle(jobs[0], 1, KEY, P, 1.0, 10_000.0, 0, 2_000)
    swept = await store.settle(jobs[0], 1, KEY, P, 1.0, 10_000.0, 0, 2_001)
    late = await store.step(KEY, P, 1.0, 0, [Step(jobs[0])])
    # Then the key was charged once and corrected once, and every call names the same front (the settle moved it
    # to the corrected turn, with the key's learnt cost)
    assert (again.charged, late.charged) == (0, 0)
    assert (settled.applied, settled.delta) == (True, 10_000 - GUESS)
    assert (swept.applied, swept.delta) == (False, 0)
    assert again.front == first.front and settled.front == swept.front == late.front
    assert settled.front is not None and (settled.front.placed.tag, settled.front.placed.advance) == (10_000, 10_000)
    assert await store.history(KEY) == History(10_000.0, 1)
    line = await store.key_line(KEY, P)
    assert line.finish == 10_000 and line.queue == tuple(jobs[1:])
    # And a resubmit of the job (its next attempt) is charged again, at the key's learnt cost
    resubmit = await store.step(KEY, P, 1.0, 0, [Step(jobs[0], attempt=2)])
    assert resubmit.charged == 1
    assert (await store.key_line(KEY, P)).finish == 20_000


async def test_a_retried_create_is_placed_as_before(redis: Redis) -> None:
    # Given a front and a parked job
    store = _store(redis)
    jobs = await _backlog(store, redis, 2)
    before = await store.key_line(KEY, P)
    # When the creates are retried (their job writes lost: the same ids again, later)
    front = await store.enter(jobs[0], KEY, P, 1.0, 5_000, 0, 0)
    parked = await store.enter(jobs[1], KEY, P, 1.0, 5_001, 0, 0)
    # Then the front is placed where it was, the parked job parked, and the key's state is unchanged
    assert (front.tag, front.parked, front.advance) == (0, False, GUESS)
    assert parked.parked
    assert await store.key_line(KEY, P) == before


async def test_the_queue_keeps_arrival_order_whatever_the_clocks(redis: Redis) -> None:
    # Given creates of one key in one millisecond, and one from a replica whose clock is behind
    store = _store(redis)
    jobs = ["job_c", "job_b", "job_a"]
    for job, created in zip(jobs, [1_000, 1_000, 900], strict=True):
        await store.enter(job, KEY, P, 1.0, created, 0, 0)
    # Then they wait in the order they were created in, the front first
    line = await store.key_line(KEY, P)
    assert line.queue == tuple(jobs) and line.front == "job_c"
    step = await store.step(KEY, P, 1.0, 0, [Step("job_c")])
    assert step.front is not None and (step.front.placed.job, step.front.more, step.front.next) == (
        "job_b",
        1,
        ("job_a",),
    )


async def test_a_crash_between_the_claim_and_the_key_step_is_repaired_by_the_settle(redis: Redis) -> None:
    # Given a front claimed whose key step never ran (the pass died): its key's next job is still parked
    store = _store(redis)
    jobs = await _backlog(store, redis, 2)
    await redis.zrem(keys.line(keys.partition_of(jobs[0])), jobs[0])
    assert await store.charge(KEY, jobs[0]) is None
    # When its run settles having taken 4 s
    settled = await store.settle(jobs[0], 1, KEY, P, 1.0, 4_000.0, 0, 2_000)
    # Then the settle did the key step, charging what the run measured (no correction left), and names the next front
    assert (settled.applied, settled.delta, settled.units) == (True, 0, 4_000)
    assert settled.front is not None and settled.front.placed.job == jobs[1] and settled.front.placed.tag == 4_000
    assert (await store.key_line(KEY, P)).finish == 4_000
    # And a late takeover's key step charges nothing
    assert (await store.step(KEY, P, 1.0, 0, [Step(jobs[0])])).charged == 0


async def test_a_front_left_parked_by_a_crash_is_placed_by_the_next_step_of_its_key(redis: Redis, backend: str) -> None:
    # Given a key step whose caller died before placing the key's next front
    store = _store(redis)
    jobs = await _backlog(store, redis, 3)
    step = await store.step(KEY, P, 1.0, 0, [Step(jobs[0])])
    assert step.front is not None
    # When the granted run settles: its settle names the same front, and its caller places it (twice: idempotent)
    settled = await store.settle(jobs[0], 1, KEY, P, 1.0, 60_000.0, 0, 2_000)
    assert settled.front == step.front
    heard = await _heard(redis, backend, [settled.front, settled.front], store)
    # Then it is in the line at its tag, once, with its fronts entry, and every replica heard it joined
    assert heard == [1, 2]
    partition = keys.partition_of(jobs[1])
    heads = (await store.heads([partition], 10))[partition]
    assert (jobs[1], float(fair.score(P, GUESS))) in heads.line
    assert jobs[1] not in dict(heads.parked)
    entry = dict(heads.fronts)[jobs[1]]
    assert (entry.advance, entry.more, entry.next, entry.key) == (GUESS, 1, (jobs[2],), KEY)


async def _heard(redis: Redis, backend: str, fronts: list[Front], store: CostStore) -> list[int]:
    """Promote `fronts` one at a time; on a single Redis also check the first one's `line J` was published."""
    if backend == "cluster":  # PUBLISH from a script reaches every node; subscribing is broker/store/signals.py's
        return [(await store.promote([front]))[0] for front in fronts]
    async with redis.pubsub() as pubsub:
        await pubsub.subscribe(keys.SIGNALS)
        answers = [(await store.promote([front]))[0] for front in fronts]
        deadline = time.monotonic() + 5
        messages: list[str] = []
        while time.monotonic() < deadline and not messages:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
            if message is not None:
                data = message["data"]
                messages.append(data.decode() if isinstance(data, bytes) else str(data))
        assert messages == [signals.joined_message(fronts[0].placed.job)]
    return answers


async def test_a_stopped_front_is_reported_gone_and_its_key_moves_on(redis: Redis) -> None:
    # Given a key's front stopped (its stop's job write took it off the line) before its key heard of it
    store = _store(redis)
    jobs = await _backlog(store, redis, 2)
    await redis.zrem(keys.line(keys.partition_of(jobs[0])), jobs[0])
    # When a step of the key names it, its placing answers gone, and the caller reports it left
    named = (await store.step(KEY, P, 1.0, 0, [])).front
    assert named is not None and named.placed.job == jobs[0]
    assert await store.promote([named]) == [0]
    moved = await store.step(KEY, P, 1.0, 0, [Step(jobs[0], left=True)])
    # Then nothing was charged and the next job is the front, at the key's F
    assert moved.charged == 0
    assert moved.front is not None
    assert (moved.front.placed.job, moved.front.placed.tag, moved.front.placed.advance) == (jobs[1], 0, GUESS)


async def test_a_parked_job_an_older_replica_stopped_is_dropped_not_placed(redis: Redis) -> None:
    # Given a parked job whose view is finished (an older broker's stop ZREMs the line only)
    store = _store(redis)
    jobs = await _backlog(store, redis, 2)
    await redis.hset(keys.view(jobs[1]), "state", orjson.dumps({"status": "cancelled"}))  # type: ignore[misc]
    step = await store.step(KEY, P, 1.0, 0, [Step(jobs[0])])
    assert step.front is not None
    # When its key's step names it as the front
    answer = await store.promote([step.front])
    # Then it is gone from the parked jobs and not in the line: the caller reports it left
    partition = keys.partition_of(jobs[1])
    assert answer == [0]
    assert await redis.zscore(keys.parked(partition), jobs[1]) is None
    assert await redis.zscore(keys.line(partition), jobs[1]) is None


async def test_a_pass_reads_the_line_the_parked_jobs_and_the_fronts_entries(redis: Redis) -> None:
    # Given a partition with a resubmit (no fronts entry), a front and a parked job, all in one partition
    store = _store(redis)
    jobs = [job for job in (f"job_{i:032x}" for i in range(400)) if keys.partition_of(job) == 7][:3]
    resubmit, front, parked = jobs
    for i, job in enumerate((front, parked)):
        await store.enter(job, KEY, P, 1.0, 1_000 + i, 0, 0)
    await redis.zadd(keys.line(7), {resubmit: 1_700_000_000_000.0, front: float(fair.score(P, 0))})
    await redis.zadd(keys.parked(7), {parked: float(fair.score(P, GUESS))})
    named = (await store.step(KEY, P, 1.0, 0, [])).front
    assert named is not None and named.placed.job == front
    assert await store.promote([named]) == [2]  # in the line already: its entry written, its place kept
    # When a pass reads the partition
    heads = (await store.heads([7], 2))[7]
    # Then it has the line's heads in order, the parked ones, and the front's entry only
    assert heads.line == ((resubmit, 1_700_000_000_000.0), (front, float(fair.score(P, 0))))
    assert heads.parked == ((parked, float(fair.score(P, GUESS))),)
    assert [(job, entry.advance, entry.more, entry.next, entry.key) for job, entry in heads.fronts] == [
        (front, GUESS, 1, (parked,), KEY)
    ]


async def test_settled_attempts_and_a_keys_history_age_out_with_retention(redis: Redis) -> None:
    # Given a key's run settled, and another one a retention later
    store = CostStore(redis, CostSettings(guess=GUESS), retention_ms=10_000)
    names = keys.cost_keys(KEY, P)
    await store.step(KEY, P, 1.0, 0, [Step("job_1"), Step("job_2")])
    await store.settle("job_1", 1, KEY, P, 1.0, 5_000.0, 0, 1_000)
    await store.settle("job_2", 1, KEY, P, 1.0, 5_000.0, 0, 12_000)
    # Then only the later one is remembered, and the key's History and settled attempts expire with no more runs
    assert [text(member) for member in await redis.zrange(names.settled, 0, -1)] == ["job_2:1"]
    assert 0 < await redis.pttl(names.history) <= 10_000
    assert 0 < await redis.pttl(names.settled) <= 10_000


async def test_going_back_unparks_every_waiting_job_into_the_line(redis: Redis) -> None:
    # Given a backlog with parked jobs in several partitions
    store = _store(redis)
    jobs = await _backlog(store, redis, 6)
    partitions = sorted({keys.partition_of(job) for job in jobs})
    # When every partition is unparked, two jobs a call
    for partition in partitions:
        while await store.unpark(partition, most=2):
            pass
    # Then every job waits in its line, in its key's order by score, and nothing is parked or planned from fronts
    places = [await redis.zscore(keys.line(keys.partition_of(job)), job) for job in jobs]
    assert None not in places and places == sorted(places)
    for partition in partitions:
        assert await redis.zcard(keys.parked(partition)) == 0
        assert await redis.exists(keys.fronts(partition)) == 0


async def test_a_key_step_places_the_front_its_pass_expected_and_leaves_another_to_place(redis: Redis) -> None:
    # Given a backlog of four jobs of one key
    store = _store(redis)
    jobs = await _backlog(store, redis, 4)
    # When a pass steps the key for its front, expecting the next job to follow, then for that one expecting a job
    # that is not next
    [first] = await store.steps([(KEY, P, 1.0, 0, [Step(jobs[0])])], [jobs[1]])
    [second] = await store.steps([(KEY, P, 1.0, 0, [Step(jobs[1])])], [jobs[3]])
    assert first.front is not None and second.front is not None and second.front.placed.job == jobs[2]
    p1, p2 = keys.partition_of(jobs[1]), keys.partition_of(jobs[2])
    if is_cluster(redis):
        # Then on a cluster (the front's partition is another slot) neither step placed its front
        assert (first.placed, second.placed) == (None, None)
        assert await redis.zscore(keys.parked(p1), jobs[1]) is not None
    else:
        # Then on a single Redis the first step placed the front it expected in its line, at its turn, with its
        # fronts entry, as a placing would; the second, whose front was another, placed none
        assert (first.placed, second.placed) == (1, None)
        assert await redis.zscore(keys.line(p1), jobs[1]) == first.front.score
        assert await redis.zscore(keys.parked(p1), jobs[1]) is None
        assert text(await redis.hget(keys.fronts(p1), jobs[1])) == first.front.entry
    assert await redis.zscore(keys.parked(p2), jobs[2]) is not None
    # and the front a step left unplaced is placed by its caller
    assert await store.promote([second.front]) == [1]
    assert await redis.zscore(keys.line(p2), jobs[2]) == second.front.score


async def test_a_front_behind_a_run_started_at_the_end_of_its_band_stays_in_its_band(redis: Redis) -> None:
    # Given a key whose jobs start at the end of their priority's band (V saturated at MAX_TAG)
    store = _store(redis)
    jobs = [f"job_{i:032x}" for i in range(3)]
    for i, job in enumerate(jobs):
        await store.enter(job, KEY, P, 1.0, 1_000 + i, fair.MAX_TAG, 0)
    # When a pass grants its first job there, and the run settles
    step = await store.step(KEY, P, 1.0, fair.MAX_TAG, [Step(jobs[0])])
    settled = await store.settle(jobs[0], 1, KEY, P, 1.0, 500.0, fair.MAX_TAG, 2_000)
    # Then its next front, behind that run, is still in the key's priority (a tag past MAX_TAG would be the next
    # priority's first place)
    assert step.front is not None and step.front.placed.tag == fair.MAX_TAG
    assert settled.front is not None and settled.front.placed.tag <= fair.MAX_TAG
    assert fair.band_of(step.front.score) == (P, fair.MAX_TAG)
