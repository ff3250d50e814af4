"""A key's front as settles and passes of several replicas place it (SPEC S4.2 "What a turn costs", `time`): the
writes of a settle and its placing are two round trips, and placings may land in any order."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from broker.admission import fair
from broker.admission.cost import CostSettings
from broker.store import keys
from broker.store.cost_store import CostStore, Step
from broker.store.replies import text
from tests.conftest import BOTH_BACKENDS
from tests.integration.store.test_cost_repairs import GUESS, KEY, P, _store

pytestmark = BOTH_BACKENDS


async def _backlog(store: CostStore, redis: Redis, key: str, n: int, virtual: int = 0) -> list[str]:
    """n jobs of `key` created at once, at `virtual`: the first its front in the line, the others parked (as the job
    write would; test_cost_repairs.py's for one key at 0)."""
    jobs = [f"job_{key}_{i:024x}" for i in range(n)]
    for i, job in enumerate(jobs):
        placed = await store.enter(job, key, P, 1.0, 1_000 + i, virtual, 0)
        where = keys.parked if placed.parked else keys.line
        await redis.zadd(where(keys.partition_of(job)), {job: fair.score(P, placed.tag)})
    return jobs


async def _line(redis: Redis) -> list[str]:
    """Every partition's line merged by score: the order a pass grants first attempts in."""
    merged: list[tuple[float, str]] = []
    for p in keys.partitions():
        merged += [(score, text(job)) for job, score in await redis.zrange(keys.line(p), 0, -1, withscores=True)]
    return [job for _, job in sorted(merged)]


async def test_a_settles_promote_that_lands_late_does_not_move_the_front_back_to_a_stale_tag(redis: Redis) -> None:
    # Two replicas settle two runs of one key and their placings land out of order: the front should stay at the
    # key's turn (the newer correction), ahead of another key's job tagged between the two.
    store = _store(redis)
    jobs = await _backlog(store, redis, KEY, 4)
    # Given two runs of the key in flight (both claimed and charged the guess) and its next job the front at F = 120,000
    await redis.zrem(keys.line(keys.partition_of(jobs[0])), jobs[0])  # the pass's claims (admission_claim.lua)
    await redis.zrem(keys.parked(keys.partition_of(jobs[1])), jobs[1])
    step = await store.step(KEY, P, 1.0, 0, [Step(jobs[0]), Step(jobs[1])])
    assert step.front is not None and step.front.placed.tag == 2 * GUESS
    assert await store.promote([step.front]) == [1]
    # and another key's front at 30,000
    other = await _backlog(store, redis, "other", 1, virtual=30_000)
    # When replica A settles the first run (1 s) and is slow to promote, replica B settles the second (1 s) and
    # promotes, then A's promote lands
    first = await store.settle(jobs[0], 1, KEY, P, 1.0, 1_000.0, 0, 2_000)
    second = await store.settle(jobs[1], 1, KEY, P, 1.0, 1_000.0, 0, 2_001)
    assert first.front is not None and second.front is not None
    assert await store.promote([second.front], move=True) == [2]
    assert await store.promote([first.front], move=True) == [2]
    # Then the front stays at its key's turn, ahead of the other key's job
    line = await store.key_line(KEY, P)
    assert line.placed is not None
    score = await redis.zscore(keys.line(keys.partition_of(jobs[2])), jobs[2])
    assert (line.placed.job, score) == (jobs[2], fair.score(P, line.placed.tag)), (first.front, second.front)
    assert await _line(redis) == [jobs[2], other[0]]


async def test_a_passs_promote_that_lands_after_a_settles_keeps_the_settles_correction(redis: Redis) -> None:
    # A pass's key step names the key's next front; a settle of the key's earlier run corrects its turn and places
    # the front first; the pass's placing lands after: the front keeps the settle's correction (a pass's placing
    # does not move a front already in the line).
    store = _store(redis)
    jobs = await _backlog(store, redis, KEY, 4)
    # Given the key's first run in flight (charged the guess) and its next job the front at 60,000
    await redis.zrem(keys.line(keys.partition_of(jobs[0])), jobs[0])  # a pass's claim (admission_claim.lua)
    step = await store.step(KEY, P, 1.0, 0, [Step(jobs[0])])
    assert step.front is not None and await store.promote([step.front]) == [1]
    other = await _backlog(store, redis, "other", 1, virtual=90_000)
    # When replica B's pass grants that front (its key step names the next front at 120,000, not yet placed) and
    # replica A settles the first run (1 s) and places the front first
    await redis.zrem(keys.line(keys.partition_of(jobs[1])), jobs[1])  # B's claim (admission_claim.lua)
    passed = await store.step(KEY, P, 1.0, 0, [Step(jobs[1])])
    done = await store.settle(jobs[0], 1, KEY, P, 1.0, 1_000.0, 0, 2_000)
    assert done.front is not None and passed.front is not None
    assert await store.promote([done.front], move=True) == [1]
    assert await store.promote([passed.front]) == [2]
    # Then the front stays at its key's corrected turn, ahead of the other key's job
    line = await store.key_line(KEY, P)
    assert line.placed is not None
    score = await redis.zscore(keys.line(keys.partition_of(jobs[2])), jobs[2])
    assert (line.placed.job, score) == (jobs[2], fair.score(P, line.placed.tag)), (done.front, passed.front)
    assert await _line(redis) == [jobs[2], other[0]]


async def test_a_settles_move_of_the_front_keeps_it_behind_an_earlier_job_of_its_key_given_back(
    redis: Redis,
) -> None:
    # A run Hermes refused goes back to the line at the tag its key was charged from; the key's other runs,
    # charged the guess, then settle short and move the key's front: the front stays behind the job given back, so
    # the key's jobs keep their arrival order (S4.2).
    store = _store(redis)
    jobs = await _backlog(store, redis, KEY, 4)
    # Given a pass that granted the key's first three jobs (each charged the guess: begins 0, 60,000, 120,000), V
    # moved past them
    for job in jobs[:3]:
        await redis.zrem(keys.line(keys.partition_of(job)), job)
        await redis.zrem(keys.parked(keys.partition_of(job)), job)
    step = await store.step(KEY, P, 1.0, 0, [Step(job) for job in jobs[:3]])
    begins = dict(step.begins)
    assert step.front is not None and await store.promote([step.front]) == [1]
    virtual = max(begins.values()) + 1
    # and Hermes refused the third job's create: it is back in its line at the place its slot kept (its begin)
    await redis.zadd(keys.line(keys.partition_of(jobs[2])), {jobs[2]: fair.score(P, begins[jobs[2]])})
    # When the first two runs settle having taken 1 s (their key's front moved by each settle)
    for n, job in enumerate(jobs[:2]):
        done = await store.settle(job, 1, KEY, P, 1.0, 1_000.0, virtual, 2_000 + n)
        assert done.front is not None
        await store.promote([done.front], move=True)
    # Then the key's jobs still wait in their order: the one given back first
    assert await _line(redis) == [jobs[2], jobs[3]], (begins, await store.key_line(KEY, P))


async def test_a_settle_after_its_keys_cost_hash_expired_still_moves_the_front(redis: Redis) -> None:
    # The settles' count (`seq`) lives in the key's cost hash, which expires RUNS_RETENTION after its last write: a
    # run longer than that, or a key held by its token budget as long, settles into a new count. Its placing must
    # still move the key's front to the corrected turn, not yield to the larger count an earlier settle placed the
    # front with (every later settle's placing would be dropped until the new count passed it).
    store = CostStore(redis, CostSettings(guess=GUESS), 300)
    jobs = await _backlog(store, redis, KEY, 5)
    # Given three runs of the key in flight (claimed, each charged the guess) and its next job the front
    for job in jobs[:3]:
        await redis.zrem(keys.line(keys.partition_of(job)), job)  # the pass's claims (admission_claim.lua)
        await redis.zrem(keys.parked(keys.partition_of(job)), job)
    step = await store.step(KEY, P, 1.0, 0, [Step(job) for job in jobs[:3]])
    assert step.front is not None and step.front.placed.job == jobs[3]
    assert await store.promote([step.front]) == [1]
    # and two of them settled (1 s each), their placings done
    for n, job in enumerate(jobs[:2]):
        done = await store.settle(job, 1, KEY, P, 1.0, 1_000.0, 0, 2_000 + n)
        assert done.front is not None and await store.promote([done.front], move=True) == [2]
    # When the key's cost hash expires (no grant nor settle of the key for its retention) and the third run settles
    history = keys.cost_history(KEY)
    for _ in range(100):
        if not await redis.exists(history):
            break
        await asyncio.sleep(0.05)
    assert not await redis.exists(history)
    done = await store.settle(jobs[2], 1, KEY, P, 1.0, 1_000.0, 0, 3_000)
    assert done.front is not None and done.front.placed.job == jobs[3]
    await store.promote([done.front], move=True)
    # Then the front waits at its key's corrected turn
    line = await store.key_line(KEY, P)
    assert line.placed is not None
    score = await redis.zscore(keys.line(keys.partition_of(jobs[3])), jobs[3])
    assert (line.placed.job, score) == (jobs[3], fair.score(P, line.placed.tag)), done.front
