"""Driving jobs through Hermes's faults (SPEC S3.2, S4), against the simulator over real HTTP and real Redis."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.events import HermesEventRecorded
from broker.simulator.state import Simulator
from broker.store.jobs import JobStore
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled

pytestmark = BOTH_BACKENDS


def creates(sim: Simulator) -> list[str | None]:
    """Idempotency-Keys of the creates Hermes accepted, in order."""
    return [r["idempotency_key"] for r in sim.requests if r["method"] == "POST" and r["path"] == "/v1/runs"
            and r["status"] == 202]  # fmt: skip


async def event_names(redis: Redis, job_id: str) -> list[str]:
    history = await JobStore(redis, retention_ms=60_000).read(job_id)
    return [type(event).__name__ for _, event in history]


async def test_a_job_completes_with_output_and_usage(make_replica: ClientFactory, sim: Simulator, redis: Redis) -> None:
    # Given a replica driving jobs against Hermes
    replica = await make_replica()
    # When a job is created
    created = await create(replica, {"input": "hello tools:2", "session_id": "s-1"})
    # Then it completes with Hermes's output, one attempt, and one create keyed by the job id
    done = await settled(replica, created["run_id"])
    assert done["status"] == "completed"
    assert done["output"] and done["usage"]["total_tokens"] > 0
    assert done["attempts"] == 1 and done["hermes_run_id"].startswith("run_")
    assert creates(sim) == [created["run_id"]]
    names = await event_names(redis, created["run_id"])
    assert names[0] == "JobCreated" and names[1] == "RunAccepted" and names[-1] == "JobFinished"
    assert names.count("HermesEventRecorded") >= 4  # tool.started/completed x2, deltas, reasoning


async def test_a_utf8_session_key_is_forwarded_as_sent(make_replica: ClientFactory, sim: Simulator) -> None:
    # Given a Hermes with an API key (it takes session keys) and a replica driving jobs against it
    sim.settings.api_key = "sekrit"
    replica = await make_replica(hermes_api_key="sekrit")
    # When a job is created with a session key of non-ASCII text
    key = "café ☃ 会话"
    created = await create(replica, {"input": "hello"}, **{"X-Hermes-Session-Key": key})
    # Then it completes, and Hermes received that very key
    assert (await settled(replica, created["run_id"]))["status"] == "completed"
    sent = [r["session_key"] for r in sim.requests if r["method"] == "POST" and r["path"] == "/v1/runs"]
    assert sent == [key]


async def test_busy_hermes_holds_the_job_then_it_runs(make_replica: ClientFactory, sim: Simulator) -> None:
    sim.settings.busy = True
    replica = await make_replica()
    created = await create(replica, {"input": "hello"})

    async def held() -> dict[str, Any] | None:
        current = await job(replica, created["run_id"])
        return current if current["hold"] else None

    holding = await eventually(held)
    assert holding["status"] == "queued" and holding["hold"]["reason"] == "busy"
    assert holding["hold"]["retry_at"] >= holding["hold"]["since"]
    assert holding["attempts"] == 0  # holding never counts
    sim.settings.busy = False
    done = await settled(replica, created["run_id"])
    assert done["status"] == "completed" and done["attempts"] == 1 and done["hold"] is None


async def test_draining_hermes_holds_with_reason_draining(make_replica: ClientFactory, sim: Simulator) -> None:
    sim.settings.draining = True
    replica = await make_replica()
    created = await create(replica, {"input": "hello"})

    async def held() -> dict[str, Any] | None:
        current = await job(replica, created["run_id"])
        return current if current["hold"] else None

    assert (await eventually(held))["hold"]["reason"] == "draining"
    sim.settings.draining = False
    assert (await settled(replica, created["run_id"]))["status"] == "completed"


async def test_hold_expires(make_replica: ClientFactory, sim: Simulator) -> None:
    sim.settings.busy = True
    replica = await make_replica(runs_hold_ms=400)
    created = await create(replica, {"input": "hello"})
    done = await settled(replica, created["run_id"])
    assert done["status"] == "failed"
    assert done["error"]["code"] == "hold_expired"
    assert done["attempts"] == 0


async def test_hermes_down_then_up(make_replica: ClientFactory, sim: Simulator) -> None:
    await sim.restart(cancel=False, down_s=1.0)  # refuses connections for a second
    replica = await make_replica()
    created = await create(replica, {"input": "hello"})

    async def held() -> dict[str, Any] | None:
        current = await job(replica, created["run_id"])
        return current if current["hold"] else None

    assert (await eventually(held))["hold"]["reason"] == "unavailable"
    assert (await settled(replica, created["run_id"]))["status"] == "completed"


async def test_restart_mid_run_resubmits_with_the_attempt_key(make_replica: ClientFactory, sim: Simulator) -> None:
    replica = await make_replica()
    created = await create(replica, {"input": "slow sleep:1"})
    job_id = created["run_id"]
    await eventually(lambda: _status_is(replica, job_id, "running"))
    # When Hermes restarts and forgets every run
    await sim.restart(cancel=False, down_s=0)
    # Then the job is resubmitted as attempt 2 with `<job>#2` and completes
    done = await settled(replica, job_id)
    assert done["status"] == "completed" and done["attempts"] == 2
    assert creates(sim) == [job_id, f"{job_id}#2"]


async def test_unrequested_cancel_is_an_interruption(make_replica: ClientFactory, sim: Simulator, redis: Redis) -> None:
    replica = await make_replica()
    created = await create(replica, {"input": "slow sleep:1"})
    job_id = created["run_id"]
    await eventually(lambda: _status_is(replica, job_id, "running"))
    await sim.restart(cancel=True, down_s=0)  # a SIGTERM'd Hermes cancels its live runs
    done = await settled(replica, job_id)
    assert done["status"] == "completed" and done["attempts"] == 2
    names = await event_names(redis, job_id)
    assert "RunInterrupted" in names and "RunResubmitted" in names


async def test_resubmits_are_exhausted(make_replica: ClientFactory, sim: Simulator) -> None:
    replica = await make_replica(runs_resubmit=1)
    created = await create(replica, {"input": "slow sleep:3"})
    job_id = created["run_id"]
    for attempt in (1, 2):
        await eventually(lambda a=attempt: _accepted(replica, job_id, a))  # type: ignore[misc]
        await sim.restart(cancel=False, down_s=0)
    done = await settled(replica, job_id)
    assert done["status"] == "failed" and done["error"]["code"] == "resubmit_exhausted"
    assert done["attempts"] == 2


async def test_stop_of_a_queued_job_never_calls_hermes(make_client: ClientFactory, make_replica: ClientFactory,
                                                        sim: Simulator) -> None:  # fmt: skip
    # Given a job created while no replica drives
    api = await make_client()
    created = await create(api, {"input": "hello"})
    stopped = await api.post(f"/v1/runs/{created['run_id']}/stop")
    assert stopped.status == 200
    assert await stopped.json() == {"run_id": created["run_id"], "status": "cancelled"}
    # When a driving replica starts
    replica = await make_replica()
    done = await job(replica, created["run_id"])
    assert done["status"] == "cancelled" and done["error"]["code"] == "stopped"
    # Then Hermes is never asked to create it (give the replica time to claim the work)
    await replica.post("/v1/runs", json={"input": "after"})
    await eventually(lambda: _any_create(sim))
    assert created["run_id"] not in creates(sim)


async def test_stop_of_a_running_job_cancels_the_hermes_run(make_replica: ClientFactory, sim: Simulator) -> None:
    replica = await make_replica()
    created = await create(replica, {"input": "slow sleep:5"})
    job_id = created["run_id"]
    await eventually(lambda: _status_is(replica, job_id, "running"))
    stopped = await replica.post(f"/v1/runs/{job_id}/stop")
    assert (await stopped.json())["status"] == "stopping"
    done = await settled(replica, job_id)
    assert done["status"] == "cancelled" and done["error"]["code"] == "stopped"
    run = sim.runs[done["hermes_run_id"]]
    assert run.status == "cancelled"
    again = await replica.post(f"/v1/runs/{job_id}/stop")
    assert await again.json() == {"run_id": job_id, "status": "cancelled"}


async def test_denied_approval_is_a_denied_stop(make_replica: ClientFactory, sim: Simulator) -> None:
    replica = await make_replica()
    created = await create(replica, {"input": "please approval"})
    job_id = created["run_id"]
    waiting = await eventually(lambda: _status_is(replica, job_id, "waiting_for_approval"))
    assert waiting["last_event"] == "approval.request"
    answer = await replica.post(f"/v1/runs/{job_id}/approval", json={"choice": "deny"})
    assert answer.status == 200
    body = await answer.json()
    assert body["choice"] == "deny" and body["run_id"] == job_id
    done = await settled(replica, job_id)
    assert done["status"] == "cancelled"
    assert done["error"]["code"] == "approval_denied" and done["error"]["message"]


async def test_approved_approval_lets_the_run_complete(make_replica: ClientFactory) -> None:
    replica = await make_replica()
    created = await create(replica, {"input": "please approval"})
    job_id = created["run_id"]
    await eventually(lambda: _status_is(replica, job_id, "waiting_for_approval"))
    always = await replica.post(f"/v1/runs/{job_id}/approval", json={"choice": "always"})
    assert always.status == 400 and (await always.json())["error"]["code"] == "approval_choice_not_allowed"
    answer = await replica.post(f"/v1/runs/{job_id}/approval", json={"choice": "approve"})
    assert answer.status == 200 and (await answer.json())["choice"] == "once"
    assert (await settled(replica, job_id))["status"] == "completed"
    late = await replica.post(f"/v1/runs/{job_id}/approval", json={"choice": "once"})
    assert late.status == 409 and (await late.json())["error"]["code"] == "approval_not_active"


async def test_a_failed_hermes_run_fails_the_job(make_replica: ClientFactory) -> None:
    replica = await make_replica()
    created = await create(replica, {"input": "fail"})
    done = await settled(replica, created["run_id"])
    assert done["status"] == "failed" and done["error"]["code"] == "hermes_failed" and done["error"]["message"]


async def test_a_lost_event_stream_is_followed_by_polling(make_replica: ClientFactory, sim: Simulator) -> None:
    replica = await make_replica()
    created = await create(replica, {"input": "slow sleep:1"})
    job_id = created["run_id"]
    running = await eventually(lambda: _status_is(replica, job_id, "running"))
    sim.runs[running["hermes_run_id"]].stream.drop_subscribers()  # type: ignore[union-attr]
    done = await settled(replica, job_id)
    assert done["status"] == "completed" and done["attempts"] == 1


async def _status_is(client: TestClient[Any, Any], job_id: str, status: str) -> dict[str, Any] | None:
    current = await job(client, job_id)
    return current if current["status"] == status else None


async def _accepted(client: TestClient[Any, Any], job_id: str, attempt: int) -> bool:
    current = await job(client, job_id)
    return bool(current["attempts"] == attempt and current["status"] == "running")


async def _any_create(sim: Simulator) -> bool:
    return bool(creates(sim))


async def test_deltas_past_the_cap_are_counted_not_stored(make_replica: ClientFactory, redis: Redis,
                                                           caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    replica = await make_replica(runs_events_maxlen=3)
    created = await create(replica, {"input": "hello tools:2"})
    done = await settled(replica, created["run_id"])
    # Then lifecycle and activity events are all stored, deltas only up to the cap, and the rest counted
    assert done["status"] == "completed" and done["dropped_deltas"] > 0
    names = await event_names(redis, created["run_id"])
    assert names[-1] == "JobFinished" and "DeltasDropped" in names
    history = await JobStore(redis, retention_ms=60_000).read(created["run_id"])
    tools = [e for _, e in history if isinstance(e, HermesEventRecorded) and e.name.startswith("tool.")]
    assert len(tools) == 4
    warned = [r for r in caplog.records if r.message.startswith("Stopped storing message deltas")]
    assert len(warned) == 1


async def test_a_stop_of_a_run_a_restarted_hermes_no_longer_holds_ends_the_job(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given upstream-main Hermes (durable keys; runs come back `interrupted`, their stop answers 409
    # run_not_active) and a slow running job
    sim.settings.upstream_main = True
    replica = await make_replica(runs_poll_interval_ms=200, runs_backoff_ms=100, runs_backoff_max_ms=400)
    created = await create(replica, {"input": "slow sleep:30"})
    job_id = created["run_id"]

    async def running() -> bool:
        return (await job(replica, job_id))["status"] == "running"

    await eventually(running)
    # When Hermes restarts (down for a moment) and the job is stopped meanwhile
    await sim.restart(cancel=False, down_s=0.6)
    answer = await replica.post(f"/v1/runs/{job_id}/stop")
    assert (await answer.json())["status"] == "stopping"
    # Then the job ends cancelled/stopped soon after Hermes is back, without a resubmit,
    # and Hermes saw only a handful of stop requests
    done = await settled(replica, job_id, timeout=5)
    assert done["status"] == "cancelled" and done["error"]["code"] == "stopped"
    assert done["attempts"] == 1 and f"{job_id}#2" not in creates(sim)
    stops = [r for r in sim.requests if r["method"] == "POST" and r["path"].endswith("/stop")]
    assert 1 <= len(stops) <= 8  # backoff 50-100, 100-200, 200-400 ms while Hermes is down: about 5
    assert stops[-1]["status"] == 409  # the answer that ended it: run_not_active
