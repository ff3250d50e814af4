"""Late keys under `ADMISSION_FAIRNESS_COST=time` (SPEC S4.2 "What a turn costs"): newcomers are paced by what
newcomers' runs cost, and neither a newcomer's long run nor that pacing keeps a key that arrives later behind a
backlog; both backends, real HTTP, the simulator."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp.test_utils import TestClient

from broker.simulator.state import Simulator
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, settled
from tests.integration.driver.test_admission import create_keys

pytestmark = BOTH_BACKENDS

Client = TestClient[Any, Any]
GUESS = 200  #: ADMISSION_FAIRNESS_GUESS (ms)


async def submit(client: Client, text: str, key: str, weight: float = 1.0) -> str:
    body = {"input": text, "scheduling": {"fairness_key": key, "fairness_weight": weight}}
    job_id: str = (await create(client, body))["run_id"]
    return job_id


async def _started(sim: Simulator, job_id: str) -> bool:
    return job_id in create_keys(sim, 202)


async def test_a_late_key_is_not_kept_behind_the_backlog_by_an_earlier_newcomers_long_run(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # One newcomer's run far longer than the newcomers' pacing moves V on by nothing: a key arriving later, that
    # cost nothing, does not inherit it as a wait behind the backlog (S4.2: a late key starts within about one round;
    # an idle key banks nothing, and owes nothing either).
    replica = await make_replica(
        hermes_max_concurrent=2, admission_fairness_cost="time", admission_fairness_guess=GUESS
    )
    backlog = [await submit(replica, f"a {i} sleep:0.05", "a") for i in range(150)]
    await eventually(lambda: _started(sim, backlog[5]), timeout=30)
    # Given key n's one long job (2 s, paced by the 0.2 s guess: no newcomer run settled yet) that ran and settled
    long = await submit(replica, "n sleep:2", "n")
    assert (await settled(replica, long, timeout=30))["status"] == "completed"
    await asyncio.sleep(0.3)  # a pass or two after the settle
    # When key c arrives with one job
    before = len(create_keys(sim, 202))
    late = await submit(replica, "c sleep:0.05", "c")
    await eventually(lambda: _started(sim, late), timeout=30)
    order = create_keys(sim, 202)
    await asyncio.gather(*(replica.post(f"/v1/runs/{job_id}/stop") for job_id in backlog))
    # Then c's job starts within about one round (a's one turn, give or take the slots freeing meanwhile)
    assert order.index(late) <= before + 4, (before, order.index(late))


async def test_a_late_key_of_short_runs_is_not_kept_behind_by_the_newcomers_average(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # Newcomers are paced by the newcomers' recent average (2 s here, from one earlier newcomer): a key whose runs
    # are far shorter (0.05 s) is not kept behind the backlog by that pacing once its first run has settled; its
    # jobs take turns with the backlog's.
    replica = await make_replica(
        hermes_max_concurrent=2, admission_fairness_cost="time", admission_fairness_guess=2_000
    )
    primer = await submit(replica, "p sleep:2", "p")
    assert (await settled(replica, primer, timeout=30))["status"] == "completed"
    backlog = [await submit(replica, f"a {i} sleep:0.05", "a") for i in range(150)]
    await eventually(lambda: _started(sim, backlog[10]), timeout=30)
    await asyncio.sleep(1.2)  # every replica has read the newcomers' average (FRESH_REFRESH_MS)
    # When key b arrives with three jobs
    before = len(create_keys(sim, 202))
    late = [await submit(replica, f"b {i} sleep:0.05", "b") for i in range(3)]
    await eventually(lambda: _started(sim, late[-1]), timeout=30)
    order = create_keys(sim, 202)
    await asyncio.gather(*(replica.post(f"/v1/runs/{job_id}/stop") for job_id in backlog))
    # Then b's jobs take every other turn with a's (two in flight already, and the settles racing the passes)
    positions = [order.index(job_id) - before for job_id in late]
    assert positions[-1] <= 2 * len(late) + 4, positions
