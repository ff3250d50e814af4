"""Several Hermes deployments (SPEC S10) as the driver sees them: an accepted run records its upstream, and the job
object shows it (null before an acceptance); a job whose run was accepted by a broker before S10 shows the first."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestServer

from broker.events import RunAccepted
from broker.http.appkeys import store_key
from broker.simulator.state import Simulator
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, job, settled


async def test_an_accepted_run_records_its_upstream_and_the_job_shows_it(
    make_replica: ClientFactory, make_client: ClientFactory, hermes_server: TestServer, sim: Simulator
) -> None:
    # Given a replica whose first upstream is the simulator (a second one is listed, nobody listens there)
    simulator = str(hermes_server.make_url("")).rstrip("/")
    name = simulator.removeprefix("http://")
    replica = await make_replica(hermes_url=f"{simulator},http://127.0.0.1:9/agent")
    # and a job created while no replica drives (it waits: upstream null)
    waiting = await make_client()
    created = await create(waiting, {"input": "hello"})
    assert created["upstream"] is None and (await job(waiting, created["run_id"]))["upstream"] is None
    # When it runs to the end
    done = await settled(replica, created["run_id"])
    # Then it shows the upstream that ran it, and its job.accepted event names it
    assert done["status"] == "completed" and done["upstream"] == name
    events = await replica.app[store_key].read(created["run_id"])  # type: ignore[index]
    accepted = [event for _, event in events if isinstance(event, RunAccepted)]
    assert [event.upstream for event in accepted] == [name]
    listed: Any = await (await replica.get("/v1/runs")).json()
    assert listed["data"][0]["upstream"] == name
