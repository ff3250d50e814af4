"""The console overview with a driving replica (SPEC S8): the admission state from /readyz's report and
the held jobs by reason while the simulator is busy."""

from __future__ import annotations

import re
from typing import Any

from aiohttp.test_utils import TestClient

from broker.simulator.state import Simulator
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job


async def test_the_overview_shows_admission_and_held_jobs_by_reason(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given a busy Hermes and a job held by it
    sim.settings.busy = True
    replica = await make_replica()
    held = (await create(replica, {"input": "hello"}))["run_id"]
    await eventually(lambda: _held(replica, held))
    # Then the overview shows the admission table, the held count by reason and the job's hold reason
    page = await (await replica.get("/console")).text()
    assert "<h2>Admission</h2>" in page
    for name in ("live", "limit", "learnt", "refusing", "line"):
        assert f"<th>{name}</th>" in page, name
    assert re.search(r'data-field="held">busy: 1<', page)
    row = re.search(rf'<tr data-job-id="{held}">(.*?)</tr>', page, flags=re.DOTALL)
    assert row is not None and "<td>busy</td>" in row[1]
    # And once Hermes accepts again, nothing is held
    sim.settings.busy = False
    await eventually(lambda: _status(replica, held, "completed"))
    page = await (await replica.get("/console")).text()
    assert re.search(r'data-field="held">none<', page)


async def _held(replica: TestClient[Any, Any], job_id: str) -> bool:
    return (await job(replica, job_id))["hold"] is not None


async def _status(replica: TestClient[Any, Any], job_id: str, status: str) -> bool:
    return bool((await job(replica, job_id))["status"] == status)


async def test_the_overview_shows_the_upstreams_side_by_side_and_each_jobs_upstream(
    make_replica: ClientFactory, sim: Simulator, hermes_server: Any
) -> None:
    # Given two upstreams (SPEC S10), the second not there, and a job run on the first
    simulator = str(hermes_server.make_url("")).rstrip("/")
    replica = await make_replica(hermes_url=f"{simulator},http://127.0.0.1:9/agent", hermes_max_concurrent=(3, 5))
    done = (await create(replica, {"input": "hello"}))["run_id"]
    await eventually(lambda: _status(replica, done, "completed"))
    # Then the overview has one column per upstream, in HERMES_URL order, and the job row names its upstream
    page = await (await replica.get("/console")).text()
    table = re.search(r'<table class="facts upstreams" data-region="upstreams">(.*?)</table>', page, flags=re.DOTALL)
    assert table is not None
    first = simulator.removeprefix("http://")
    assert re.findall(r'data-upstream="([^"]+)"', table[1]) == [first, "127.0.0.1:9/agent"]
    assert re.search(r"<tr><th>limit</th><td>3</td><td>5</td></tr>", table[1])
    row = re.search(rf'<tr data-job-id="{done}">(.*?)</tr>', page, flags=re.DOTALL)
    assert row is not None and f"<td>{first}</td>" in row[1]
