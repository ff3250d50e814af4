"""Streamed text waits a little for the next events so a burst is stored in one write (broker/driver/pump.py);
a replica that drains meanwhile stores what it read before it hands the job back: nothing it read is lost."""

from __future__ import annotations

import asyncio

import pytest

from broker import app as composition
from broker.driver import pump
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled
from tests.integration.driver.test_deltas import _frames

READ_S = 0.6  #: the run streams a delta every 100 ms: about five are read by then


async def test_a_draining_replica_stores_the_events_waiting_in_its_linger(
    make_replica: ClientFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pump, "LINGER_S", 60.0)  # every delta would wait until the run ends
    first = await make_replica()
    created = await create(first, {"input": "deltas:30 sleep:3"})
    job_id = created["run_id"]

    async def running() -> bool:
        return (await job(first, job_id))["status"] == "running"

    await eventually(running)
    # The deltas wait inside the runner, where nothing outside it can see them: give the run time to send some.
    await asyncio.sleep(READ_S)
    await composition.drain(first.app)  # SIGTERM: the job is handed back

    second = await make_replica()  # takes the job over: it polls the run to its end
    finished = await settled(second, job_id)
    assert finished["status"] == "completed"
    frames = await _frames(second, job_id)
    deltas = [data for _, data in frames if b'"message.delta"' in data]
    assert len(deltas) >= 3, frames  # stored by the drain; none would be without it (the stream is single-use)
    assert finished["output"].startswith("".join(f"d{n} " for n in range(len(deltas))))


async def test_a_streamed_answer_takes_fewer_writes_than_events(make_replica: ClientFactory) -> None:
    replica = await make_replica()
    created = await create(replica, {"input": "deltas:20 sleep:0.2"})  # a delta every 10 ms
    finished = await settled(replica, created["run_id"])
    frames = await _frames(replica, created["run_id"])
    deltas = [frame_id for frame_id, data in frames if b'"message.delta"' in data]
    assert finished["status"] == "completed" and len(deltas) == 20
    # One write stores its events under one millisecond, in order: 20 deltas 10 ms apart share a few of them.
    assert len({frame_id.split("-")[0] for frame_id in deltas}) <= 10, deltas
