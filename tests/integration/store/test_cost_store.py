"""The cost scripts (SPEC S4.2 "What a turn costs", broker/store/cost_store.py) on a real Redis, single and cluster:
driven side by side with broker/admission/cost.py (tests/integration/store/cost_reference.py) for any sequence of
creates, grants, stops and settles, every reply and every key's state, History and charges are the pure functions'."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, event, example, given, note, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from broker.admission import fair
from broker.admission.cost import CostMode, CostSettings, History, KeyLine
from broker.store import keys
from broker.store.cost_store import CostStore, Front, KeyStep, Step
from tests.conftest import BOTH_BACKENDS
from tests.integration.store.cost_reference import Reference, normal

pytestmark = BOTH_BACKENDS

RETENTION_MS = 3_600_000
RUNS = itertools.count()  #: each example's own keys and jobs (no flush between examples)
JOBS = 16  #: job i is of key i % 2 and priority 1 when i % 4 < 2, else 3 (four jobs a key and priority)
#: the two keys' weights: tiny ones charge fair.MAX_ADVANCE
weights = st.tuples(*[st.sampled_from([1.0, 2.5, 0.3, 7.0, 1e-6])] * 2)

costs = st.integers(-1, 200_000) | st.just(10**12)  #: what a run measured (-1: nothing); a huge one saturates
Op = tuple[str, int, int, int]  #: (what, job, attempt or V step, measured)
ops = st.one_of(
    st.tuples(st.just("enter"), st.integers(0, JOBS - 1), st.just(0), st.just(0)),
    st.tuples(st.just("enter"), st.integers(0, JOBS - 1), st.just(0), st.just(0)),
    st.tuples(st.just("grant"), st.integers(0, JOBS - 1), st.integers(1, 2), st.integers(0, 3)),
    st.tuples(st.just("left"), st.integers(0, JOBS - 1), st.just(1), st.just(0)),
    st.tuples(
        st.just("settle"), st.integers(0, JOBS - 1), st.integers(1, 2), st.integers(-1, 200_000) | st.just(10**12)
    ),
    st.tuples(st.just("tick"), st.just(0), st.integers(0, 90_000) | st.just(2**49), st.just(0)),  # V at MAX_TAG too
    st.tuples(st.just("retry"), st.integers(0, JOBS - 1), st.just(0), st.just(0)),
    st.tuples(st.just("burst"), st.integers(0, 3), st.just(0), st.just(0)),  # a key's jobs created at once
    st.tuples(st.just("pass"), st.integers(0, 3), st.integers(1, 2), st.integers(0, 2)),  # a key's first jobs granted
    st.tuples(st.just("ends"), st.integers(0, JOBS - 1), st.integers(1, 2), costs),  # a run settles
)
modes = st.builds(CostSettings, st.sampled_from(list(CostMode)), st.integers(1, 60_000))


class Both:
    """The store and the reference, fed the same calls."""

    def __init__(self, redis: Redis, settings: CostSettings, weights: tuple[float, float]) -> None:
        self.redis = redis
        self.weights = weights
        self.store = CostStore(redis, settings, RETENTION_MS)
        self.model = Reference(settings)
        self.run = next(RUNS)
        self.virtual = 0
        self.now = 1_000
        self.entered: set[int] = set()  #: jobs created, or taken before (a job is created before it runs, once)

    def job(self, i: int) -> str:
        return f"job_{self.run}_{i}"

    def key(self, i: int) -> str:
        return f"k{self.run}|{i % 2}"  # a `|` in a key: the store's fields put the key last

    def scheduling(self, i: int) -> tuple[str, int, float]:
        return self.key(i), 1 if i % 4 < 2 else 3, self.weights[i % 2]

    async def enter(self, i: int) -> None:
        key, priority, weight = self.scheduling(i)
        self.now += 1
        paced = 777
        placed = await self.store.enter(self.job(i), key, priority, weight, self.now, self.virtual, paced)
        assert placed == self.model.enter(self.job(i), key, priority, weight, self.virtual, paced)
        self.entered.add(i)
        partition = keys.partition_of(self.job(i))  # the job write: in the line (a front, with its entry) or parked
        await self.redis.zadd(
            (keys.parked if placed.parked else keys.line)(partition), {self.job(i): fair.score(priority, placed.tag)}
        )
        if not placed.parked:
            await self.redis.hset(keys.fronts(partition), self.job(i), Front(key, priority, placed).entry)  # type: ignore[misc]

    async def retried(self, i: int) -> None:
        key, priority, weight = self.scheduling(i)
        line = self.model.lines.get((priority, key), KeyLine())
        if self.job(i) not in line.queue:
            return
        self.now += 1
        placed = await self.store.enter(self.job(i), key, priority, weight, self.now, self.virtual, 777)
        assert placed == line.placed if line.front == self.job(i) else placed.parked

    async def taken(self, jobs: list[Step]) -> None:
        """A claim (or a stop's job write): the jobs leave their partition's line, parked jobs and fronts."""
        self.entered |= {int(step.job.rsplit("_", 1)[1]) for step in jobs}
        for step in jobs:
            partition = keys.partition_of(step.job)
            await self.redis.zrem(keys.line(partition), step.job)
            await self.redis.zrem(keys.parked(partition), step.job)
            await self.redis.hdel(keys.fronts(partition), step.job)  # type: ignore[misc]

    async def placed(self, front: Front | None, *, move: bool = False) -> None:
        """The caller places the front a key step or a settle (`move`) named: it waits (parked, or in the line
        already)."""
        if front is not None:
            assert await self.store.promote([front], move=move) in ([1], [2])

    async def step(self, i: int, steps: list[Step]) -> KeyStep:
        key, priority, weight = self.scheduling(i)
        await self.taken(steps)
        done = await self.store.step(key, priority, weight, self.virtual, steps)
        assert done.charged == self.model.step(key, priority, weight, self.virtual, steps)
        event(f"step: charged={done.charged} more={min(done.front.more, 2) if done.front else None}")
        self.same_front(done.front, i)
        await self.placed(done.front)
        return done

    async def settle(self, i: int, attempt: int, measured: float | None) -> None:
        key, priority, weight = self.scheduling(i)
        self.now += 1
        job = self.job(i)
        charge = await self.store.charge(key, job)
        await self.taken([Step(job)])  # a run settles after its claim
        done = await self.store.settle(job, attempt, key, priority, weight, measured, self.virtual, self.now)
        applied, delta, settled, units = self.model.settle(job, attempt, key, priority, weight, measured, self.virtual)
        assert (done.applied, done.delta) == (applied, delta)
        sign = "0" if not delta else "+" if delta > 0 else "-"
        event(f"settle: applied={applied} delta={sign} fallback={charge is None}")
        if applied:
            assert settled is not None
            assert charge in (None, settled)  # none: the settle charged it (its key step never ran)
            assert (done.at_v, done.paced, done.units) == (settled.at_v, settled.paced, units)
        self.same_front(done.front, i)
        await self.placed(done.front, move=True)

    def same_front(self, front: Front | None, i: int) -> None:
        key, priority, _ = self.scheduling(i)
        placed, more, following = self.model.front(priority, key)
        assert (front.placed if front else None) == placed
        assert ((front.more, front.next) if front else (0, ())) == (more, following)

    async def same_state(self) -> None:
        await self.same_places()
        for i in range(JOBS):
            key, priority, _ = self.scheduling(i)
            stored = normal(await self.store.key_line(key, priority), self.virtual)  # F <= V: as good as none
            assert stored == self.model.line(priority, key, self.virtual)
            assert await self.store.history(key) == self.model.history.get(key, History())
            assert await self.store.charge(key, self.job(i)) == self.model.charges.get(self.job(i))

    async def play(self, what: str, i: int, n: int, measured: int) -> None:
        """One op of a plan (Op); jobs are created once, before anything else happens to them."""
        cost = None if measured < 0 else float(measured)
        if what in ("enter", "burst"):  # one job, or every job of its key and priority
            for j in [i] if what == "enter" else range(i, JOBS, 4):
                if j not in self.entered:
                    await self.enter(j)
        elif what == "retry":  # a create retried (its job write lost) while the job waits: placed as before
            await self.retried(i)
        elif what == "grant":
            await self.grant(i, n, measured + 1)
        elif what == "left":
            await self.step(i, [Step(self.job(i), left=True)])
        elif what == "settle":
            await self.settle(i, n, cost)
        elif what == "pass":  # the first jobs of the key and priority of group i (jobs i, i + 4, ...)
            queue = self.model.lines.get(self.scheduling(i)[1::-1], KeyLine()).queue
            jobs = [int(job.rsplit("_", 1)[1]) for job in queue[: measured + 1]]
            if jobs:
                await self.step(jobs[0], [Step(self.job(j), n) for j in jobs])
        elif what == "ends" and self.model.charges:  # a run in flight settles
            job = sorted(self.model.charges)[i % len(self.model.charges)]
            await self.settle(int(job.rsplit("_", 1)[1]), n, cost)
        elif what == "tick":
            self.virtual = min(self.virtual + n, fair.MAX_TAG)

    async def grant(self, i: int, attempt: int, most: int) -> None:
        """Jobs of one key and priority (jobs i, i + 4, ...) in one step: the front, parked ones, or none waiting; of
        the jobs created (a pass claims jobs it read from the line)."""
        jobs = [j for j in list(range(i, JOBS, 4))[:most] if j in self.entered]
        if jobs:
            await self.step(jobs[0], [Step(self.job(j), attempt) for j in jobs])

    async def same_places(self) -> None:
        """Every waiting job of a key is in its partition's line (its key's front, at its tag) or parked: none lost."""
        for group in range(4):
            key, priority, _ = self.scheduling(group)
            line = self.model.lines.get((priority, key), KeyLine())
            for job in line.queue:
                partition = keys.partition_of(job)
                front, parked = (
                    await self.redis.zscore(keys.line(partition), job),
                    await self.redis.zscore(keys.parked(partition), job),
                )
                if job == line.front and line.placed is not None:
                    assert (front, parked) == (fair.score(priority, line.placed.tag), None)
                else:
                    assert front is None and parked is not None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(settings_=modes, weights_=weights, plan=st.lists(ops, max_size=40))
# a key's run in flight in another priority does not hold back its front in this one (its cost hash is per key)
@example(
    settings_=CostSettings(CostMode.TIME, 1),
    weights_=(1.0, 1.0),
    plan=[("burst", 0, 0, 0), ("grant", 2, 1, 0), ("left", 0, 1, 0)],
)
async def test_the_scripts_compute_what_cost_py_computes(
    redis: Redis, settings_: CostSettings, weights_: tuple[float, float], plan: list[Op]
) -> None:
    note(f"{settings_} {weights_} {plan}")
    both = Both(redis, settings_, weights_)
    for what, i, n, measured in plan:
        await both.play(what, i, n, measured)
        await both.same_state()


async def _calls(redis: Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


async def test_a_create_takes_its_turn_without_counting_its_keys_queue(redis: Redis, backend: str) -> None:
    if backend == "cluster":
        pytest.skip("counts the commands of one Redis (INFO commandstats)")
    both = Both(redis, CostSettings(CostMode.TIME, 60_000), (1.0, 1.0))
    # When the first job of a key and then a second one take their turns (the front, then parked behind it)
    await redis.config_resetstat()
    for i in (0, 4):
        await both.enter(i)  # (each placing checked against cost.py)
    # Then neither counted the queue it had just joined (it holds a job: the key's line is kept in its keys hash)
    assert "zcard" not in await _calls(redis)
    await both.same_state()


async def test_a_key_step_and_a_settle_read_their_keys_queue_and_history_once(redis: Redis, backend: str) -> None:
    if backend == "cluster":
        pytest.skip("counts the commands of one Redis (INFO commandstats)")
    # Given a key of three waiting jobs
    both = Both(redis, CostSettings(CostMode.TIME, 60_000), (1.0, 1.0))
    for i in (0, 4, 8):
        await both.enter(i)
    job = both.job(0)
    key, priority, weight = both.scheduling(0)
    await both.taken([Step(job, 1)])
    # When a pass grants its first (the key step charges it) and places the next front
    await redis.config_resetstat()
    stepped = await both.store.step(key, priority, weight, both.virtual, [Step(job, 1)])
    # Then the step does what cost.py computes, reading the queue's length, its head and the key's cost hash (its
    # History, its charges) once each
    assert stepped.charged == both.model.step(key, priority, weight, both.virtual, [Step(job, 1)]) == 1
    both.same_front(stepped.front, 0)
    assert ((calls := await _calls(redis))["zcard"], calls["zrange"], calls["hgetall"]) == (1, 1, 1)
    assert "hmget" not in calls and "hexists" not in calls
    await both.placed(stepped.front)
    # When the run settles, having measured its time
    await redis.config_resetstat()
    done = await both.store.settle(job, 1, key, priority, weight, 30_000.0, both.virtual, both.now)
    # Then it does what cost.py computes
    applied, delta, _, _ = both.model.settle(job, 1, key, priority, weight, 30_000.0, both.virtual)
    assert (done.applied, done.delta) == (applied, delta) == (True, 30_000 - 60_000)
    # And it read the queue's length and the key's cost hash (its History, its charge, the charges in flight) once
    # each, its line with one HGET, and renewed the retention of the cost hash and the settled zset once each
    calls = await _calls(redis)
    assert (calls["zcard"], calls["hgetall"], calls["hget"], calls["pexpire"]) == (1, 1, 1, 2)
    assert "hmget" not in calls and "hexists" not in calls and "exists" not in calls
    both.same_front(done.front, 0)
    # And placing the front it moved writes its entry and the settle's count in one HSET
    await redis.config_resetstat()
    await both.placed(done.front, move=True)
    assert (await _calls(redis))["hset"] == 1
    await both.same_state()
