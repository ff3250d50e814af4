"""Adversarial review of a conversation's turns (SPEC S4.3) against the simulator over real HTTP and real Redis:
each test is a way two turns of one session overlap on Hermes, or a turn waits longer than it should."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from broker.app import supervisor_key, writer_key
from broker.simulator.app import create_app as create_simulator
from broker.simulator.state import Settings, Simulator
from broker.store import leases as leases_module
from broker.store.scripts import run_many
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled


class _Hermes(TestServer):
    """The simulator as a real Hermes is served: a create whose caller hung up still runs to its end (aiohttp's test
    server would cancel it), so a create whose answer was lost still starts its run."""

    async def _make_runner(self, **kwargs: Any) -> Any:
        kwargs["handler_cancellation"] = False
        return await super()._make_runner(**kwargs)


#: seconds Hermes takes to answer a create after it started the run (the answer a short HERMES_TIMEOUT loses)
ANSWER_LAG = {"s": 0.0}


@web.middleware
async def _late_answers(request: web.Request, handler: Any) -> web.StreamResponse:
    response = await handler(request)
    if request.method == "POST" and request.path == "/v1/runs" and ANSWER_LAG["s"] > 0:
        await asyncio.sleep(ANSWER_LAG["s"])
    return response


@pytest.fixture
async def hermes_server() -> AsyncIterator[TestServer]:
    app = create_simulator(Settings(step_s=0.01, events_wait_s=0.2))
    app.middlewares.append(_late_answers)
    ANSWER_LAG["s"] = 0.0
    server = _Hermes(app)
    await server.start_server()
    yield server
    await server.close()


@contextlib.asynccontextmanager
async def overlap_watch(sim: Simulator, session: str) -> AsyncIterator[list[int]]:
    """Samples Hermes's live runs of `session` every 10 ms; yields [the most seen live at once]."""
    peak = [0]

    async def watch() -> None:
        while True:
            live = sum(1 for run in sim.runs.values() if run.session_id == session and not run.terminal)
            peak[0] = max(peak[0], live)
            await asyncio.sleep(0.01)

    task = asyncio.create_task(watch())
    try:
        yield peak
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def held(client: TestClient[Any, Any], job_id: str, reason: str) -> dict[str, Any] | None:
    view = await job(client, job_id)
    return view if (view.get("hold") or {}).get("reason") == reason else None


async def test_a_stopped_turn_whose_create_answer_was_lost_keeps_its_session_until_hermes_answered(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given a Hermes that honours Idempotency-Key and answers a create 1 s after it started the run, and a broker
    # that waits 300 ms
    sim.settings.upstream_main = True
    ANSWER_LAG["s"] = 1.0
    replica = await make_replica(hermes_timeout_ms=300)
    async with overlap_watch(sim, "s-lost") as peak:
        first = (await create(replica, {"input": "first sleep:3", "session_id": "s-lost"}))["run_id"]
        second = (await create(replica, {"input": "second sleep:1", "session_id": "s-lost"}))["run_id"]
        # When the first turn's create got no answer (Hermes starts its run anyway, a little later)
        await eventually(lambda: held(replica, first, "unavailable"), timeout=10)
        ANSWER_LAG["s"] = 0.0
        # and the caller stops the first turn while it holds (queued: it is cancelled at once)
        answer = await replica.post(f"/v1/runs/{first}/stop")
        assert answer.status == 200
        # Then the second turn still never runs beside the first turn's run on Hermes (SPEC S4.3: "the session
        # stays held until Hermes answered for that run or the upstream is lost")
        assert (await settled(replica, second, timeout=20))["status"] == "completed"
        await asyncio.sleep(0.2)
    assert any(run.session_id == "s-lost" and run.idempotency_key == first for run in sim.runs.values())
    assert peak[0] == 1, f"{peak[0]} runs of session s-lost were live on Hermes at once"


async def test_a_turn_whose_create_answer_was_lost_keeps_its_session_when_its_hold_expires(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given a Hermes that honours Idempotency-Key and answers a create 1 s after it started the run, a broker that
    # waits 300 ms for it, and a short RUNS_HOLD
    sim.settings.upstream_main = True
    ANSWER_LAG["s"] = 1.0
    replica = await make_replica(hermes_timeout_ms=300, runs_hold_ms=1_500)
    async with overlap_watch(sim, "s-expired") as peak:
        first = (await create(replica, {"input": "first sleep:4", "session_id": "s-expired"}))["run_id"]
        second = (await create(replica, {"input": "second sleep:1", "session_id": "s-expired"}))["run_id"]
        # When no answer to the first turn's creates arrives before its hold expires (its run is live on Hermes)
        ended = await settled(replica, first, timeout=10)
        assert ended["error"]["code"] == "hold_expired", ended
        await asyncio.sleep(1.0)  # the look-up at its end gets no answer either: its runner must look again
        ANSWER_LAG["s"] = 0.0
        # Then the second turn does not run beside the first turn's run while Hermes has not answered for it
        await settled(replica, second, timeout=20)
        await asyncio.sleep(0.2)
    assert any(run.idempotency_key == first for run in sim.runs.values())
    assert peak[0] == 1, f"{peak[0]} runs of session s-expired were live on Hermes at once"


async def test_a_turn_that_runs_longer_than_runs_retention_still_holds_its_session(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given a broker that keeps ended jobs 1.5 s (RUNS_RETENTION), and a session's only turn whose run takes 4 s
    replica = await make_replica(runs_retention_ms=1_500)
    async with overlap_watch(sim, "s-long") as peak:
        first = (await create(replica, {"input": "first sleep:4", "session_id": "s-long"}))["run_id"]
        await eventually(lambda: _status(replica, first, "running"))
        # When the next turn is created after RUNS_RETENTION has passed without another write to the session
        await asyncio.sleep(2.0)
        second = (await create(replica, {"input": "second sleep:0.5", "session_id": "s-long"}))["run_id"]
        # Then it waits for the first turn (a live turn's session is never released by a timer, SPEC S4.3)
        await settled(replica, second, timeout=20)
        assert (await job(replica, first))["status"] == "completed"
    assert peak[0] == 1, f"{peak[0]} runs of session s-long were live on Hermes at once"


async def _status(client: TestClient[Any, Any], job_id: str, status: str) -> bool:
    return bool((await job(client, job_id))["status"] == status)


async def test_turns_waiting_for_their_sessions_hold_no_slot_from_a_sessionless_job(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given two Hermes slots, each held by the first turn of a session, with twenty more turns of each waiting
    replica = await make_replica(hermes_max_concurrent=2)
    holders = [(await create(replica, {"input": "hold sleep:30", "session_id": f"s-w{n}"}))["run_id"] for n in range(2)]
    for job_id in holders:
        await eventually(lambda job_id=job_id: _status(replica, job_id, "running"))
    waiting = [
        (await create(replica, {"input": "later sleep:0.1", "session_id": f"s-w{n % 2}"}))["run_id"] for n in range(40)
    ]
    # When a job without a session comes, and one holder ends early (stopped)
    alone = (await create(replica, {"input": "alone sleep:0.1"}))["run_id"]
    assert (await replica.post(f"/v1/runs/{holders[0]}/stop")).status in (200, 202)
    # Then the sessionless job gets a slot while the other holder still runs (the waiting turns hold none)
    done = await settled(replica, alone, timeout=10)
    assert done["status"] == "completed"
    assert (await job(replica, holders[1]))["status"] == "running"
    assert (await job(replica, waiting[1]))["hold"]["reason"] == "session"


async def test_a_turn_whose_ending_write_is_answered_after_a_lease_renewal_still_hands_its_session_on(
    make_replica: ClientFactory,
) -> None:
    # Given a replica renewing its leases every 200 ms, whose write that ends a job is answered late (a busy replica:
    # Redis ran it, released the run lease with it, and the reply is read half a second later)
    replica = await make_replica(runs_lease_ms=600)

    async def answered_late(append: Append, args: tuple[Any, ...], fields: dict[str, Any], ids: Any) -> Any:
        await asyncio.sleep(0.5)
        return ids

    _on_ending_writes(replica, answered_late)
    # When a session's first turn ends while its next one waits
    first = (await create(replica, {"input": "first sleep:0.3", "session_id": "s-late"}))["run_id"]
    second = (await create(replica, {"input": "second", "session_id": "s-late"}))["run_id"]
    # Then the renewals meanwhile (finding the lease gone) do not cut the first turn's runner short of handing the
    # session on: the next turn runs at once, not at its recheck 30 s later
    assert (await settled(replica, first, timeout=10))["status"] == "completed"
    assert (await settled(replica, second, timeout=10))["status"] == "completed"


async def test_a_renewal_answered_after_its_runner_finished_takes_nothing_from_the_finished_job(
    make_replica: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a replica whose lease renewals reach Redis 0.4 s after they set out (a slow link): a job that finishes
    # meanwhile has released its lease, and the renewal finds it gone once its runner is done
    replica = await make_replica(runs_lease_ms=1_500)
    supervisor = replica.app[supervisor_key]  # type: ignore[index]

    async def slow(*args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.4)
        return await run_many(*args, **kwargs)

    monkeypatch.setattr(leases_module, "run_many", slow)
    # When a session's turns run one after another
    turns = [
        (await create(replica, {"input": f"turn {n} sleep:0.1", "session_id": "s-slow"}))["run_id"] for n in range(8)
    ]
    # Then each completes, and no finished job is taken for lost (its task cancelled in its hand-back, its id kept)
    for job_id in turns:
        assert (await settled(replica, job_id, timeout=20))["status"] == "completed"
    await asyncio.sleep(0.5)  # the last renewal on its way is answered
    assert supervisor._lost == set()


async def test_a_turn_whose_ending_write_ran_but_was_answered_fenced_still_lets_its_slot_and_session_go(
    make_replica: ClientFactory,
) -> None:
    # Given a replica whose write that ends a job runs, but whose reply is lost: sent again on a new connection, the
    # write finds no lease (the first one released it) and is answered FENCED
    replica = await make_replica()

    async def sent_again(append: Append, args: tuple[Any, ...], fields: dict[str, Any], ids: Any) -> Any:
        return await append(*args, **fields)  # raises LeaseLost

    _on_ending_writes(replica, sent_again)
    # When a session's first turn ends while its next one waits
    first = (await create(replica, {"input": "first sleep:0.3", "session_id": "s-fenced"}))["run_id"]
    second = (await create(replica, {"input": "second", "session_id": "s-fenced"}))["run_id"]
    # Then the first turn's slot and session are let go at once: the next turn runs, not at its recheck 30 s later,
    # and once it ended too no slot stays held
    assert (await settled(replica, first, timeout=10))["status"] == "completed"
    assert (await settled(replica, second, timeout=10))["status"] == "completed"

    async def no_slot_held() -> bool:
        return bool((await (await replica.get("/readyz")).json())["admission"]["live"] == 0)

    await eventually(no_slot_held, timeout=3)


Append = Callable[..., Awaitable[Any]]


def _on_ending_writes(
    replica: TestClient[Any, Any], answer: Callable[[Append, tuple[Any, ...], dict[str, Any], Any], Awaitable[Any]]
) -> None:
    """The replica's job writes, each write that ends a job (releasing its run lease) answered by `answer` once it
    ran in Redis: given the real write, its arguments and its reply."""
    store = replica.app[writer_key].store  # type: ignore[index]
    append = store.append

    async def wrapped(*args: Any, **fields: Any) -> Any:
        ids = await append(*args, **fields)
        if args[2].status.terminal and fields.get("release"):  # (job_id, events, view)
            return await answer(append, args, fields, ids)
        return ids

    store.append = wrapped
