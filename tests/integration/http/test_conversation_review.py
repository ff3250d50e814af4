"""Adversarial review of a conversation's create strategies (SPEC S4.3) on a real Redis, without a driver: `reject`
under concurrent creates, `interrupt` replayed after its first create died half-way."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from broker.jobs.service import JobService
from tests.integration.conftest import ClientFactory


async def test_concurrent_rejecting_creates_of_an_idle_session_take_exactly_one(make_client: ClientFactory) -> None:
    # Given an idle session
    client = await make_client()
    # When five turns that ask to be rejected while the session is busy are created at the same time
    bodies = [{"input": f"turn {i}", "session_id": "s-race", "scheduling": {"multitask": "reject"}} for i in range(5)]
    answers = await asyncio.gather(*(client.post("/v1/runs", json=body) for body in bodies))
    statuses = sorted(answer.status for answer in answers)
    # Then one is taken and the others are refused with 409 session_busy (the first holds the session)
    assert statuses == [202, 409, 409, 409, 409], statuses


async def test_an_interrupting_create_replayed_after_it_died_half_way_still_supersedes_the_earlier_turns(
    make_client: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a session with a queued turn (no replica drives jobs here)
    client = await make_client()
    earlier = await _created(client, {"input": "earlier", "session_id": "s-int"})
    # When an interrupting turn's create dies after its job is stored (the replica lost Redis, or was killed)
    interrupt = JobService._interrupt

    async def dies(self: JobService, view: Any) -> None:
        raise ConnectionError("the replica died here")

    monkeypatch.setattr(JobService, "_interrupt", dies)
    body = {"input": "latest", "session_id": "s-int", "scheduling": {"multitask": "interrupt"}}
    first_try = await client.post("/v1/runs", json=body, headers={"Idempotency-Key": "latest-1"})
    assert first_try.status >= 500
    monkeypatch.setattr(JobService, "_interrupt", interrupt)
    # and the caller sends it again with its Idempotency-Key
    again = await client.post("/v1/runs", json=body, headers={"Idempotency-Key": "latest-1"})
    assert again.status == 202 and (await again.json())["replayed"] is True
    # Then the earlier turn is superseded, as with a create that did not die
    view = await (await client.get(f"/v1/runs/{earlier}")).json()
    assert view["status"] == "cancelled" and view["error"]["code"] == "superseded", view


async def _created(client: TestClient[Any, Any], body: dict[str, Any]) -> str:
    answer = await client.post("/v1/runs", json=body)
    assert answer.status == 202, await answer.text()
    return str((await answer.json())["run_id"])
