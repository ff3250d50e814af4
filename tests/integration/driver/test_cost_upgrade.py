"""ADMISSION_FAIRNESS_COST time beside a line and a replica that charge per job (design 7: a rolling upgrade from
today's broker, whose pass reads the line only and whose creates place every job at a fixed tag), driven end to end
on both backends: every job runs once, each key in its arrival order, and nothing is left waiting or counted."""

from __future__ import annotations

from redis.asyncio import Redis

from broker.simulator.state import Simulator
from broker.store import keys
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.test_admission import create_keys
from tests.integration.driver.test_fairness import all_settled, submit

pytestmark = BOTH_BACKENDS


async def _empty(redis: Redis, finished: set[str] | None = None) -> None:
    """No job waits in a line or parked, and nothing is counted; fronts entries are left only of `finished` jobs (a
    front a per-job replica granted: its claim and its end do not know the fronts hash; a pass reads only the entries
    of the jobs in its line, and fair_promote drops one when its key is stepped again)."""
    for p in keys.partitions():
        left = [name for name in (keys.line(p), keys.parked(p), keys.fair(p)) if await redis.exists(name)]
        assert not left, left
        fronts = set(await redis.hkeys(keys.fronts(p)))
        assert fronts <= (finished or set()), fronts


async def test_a_per_job_replica_beside_a_cost_aware_one_runs_every_job_once_in_each_keys_order(
    make_client: ClientFactory, make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given backlogs created by a replica charging slot time (each key's first job in the line, the others parked)
    client = await make_client(admission_fairness_cost="time")
    a = [await submit(client, f"a {i} sleep:0.05", key="a") for i in range(8)]
    b = [await submit(client, f"b {i} sleep:0.05", key="b") for i in range(4)]
    # When a replica of the previous kind (its pass reads the line only) and a cost-aware one drive them together
    old = await make_replica(hermes_max_concurrent=2, admission_fairness_cost="runs")
    await make_replica(hermes_max_concurrent=2, admission_fairness_cost="time")
    done = await all_settled(old, a + b, timeout=90)
    # Then every job ran once, each key in its arrival order, and the line, the parked jobs and the counts are empty
    assert {d["status"] for d in done} == {"completed"} and {d["attempts"] for d in done} == {1}
    order = create_keys(sim, 202)
    assert sorted(order) == sorted(a + b)
    assert [j for j in order if j in a] == a and [j for j in order if j in b] == b
    await _empty(redis, set(a + b))


async def test_a_line_placed_per_job_is_driven_in_order_by_a_cost_aware_replica(
    make_client: ClientFactory, make_replica: ClientFactory, sim: Simulator, redis: Redis
) -> None:
    # Given a line written by a broker charging per job (every job in the line at a fixed tag, no key queues)
    client = await make_client(admission_fairness_cost="runs")
    a = [await submit(client, f"a {i}", key="a") for i in range(5)]
    b = [await submit(client, f"b {i}", key="b") for i in range(3)]
    # and later creates of the same keys by the new kind
    new = await make_client(admission_fairness_cost="time")
    later = [await submit(new, "a late", key="a"), await submit(new, "b late", key="b")]
    # When a cost-aware replica drives them one at a time
    replica = await make_replica(hermes_max_concurrent=1, admission_fairness_cost="time")
    await all_settled(replica, a + b + later)
    # Then each key's old jobs go in their order, before its new one (whose start is past its old turns)
    order = create_keys(sim, 202)
    assert [j for j in order if j in a or j == later[0]] == [*a, later[0]]
    assert [j for j in order if j in b or j == later[1]] == [*b, later[1]]
    await _empty(redis)
