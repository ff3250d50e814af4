"""A job Hermes rejects (SPEC S3.2, S7): its error always carries what Hermes (or whatever answered for it) said."""

from __future__ import annotations

from broker.simulator.state import Simulator
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, settled

NGINX_413 = "Hermes answered HTTP 413: 413 Request Entity Too Large 413 Request Entity Too Large nginx"


async def test_a_create_refused_with_a_page_that_is_not_the_envelope_fails_with_its_status_and_text(
    make_replica: ClientFactory, sim: Simulator
) -> None:
    # Given a proxy in front of Hermes that takes less than the broker lets through (nginx's 1 MiB default)
    sim.settings.proxy_max_body = 1_000
    replica = await make_replica()
    # When a job's execution body is over the proxy's limit and within HERMES_MAX_BODY
    job = await create(replica, {"input": "x" * 2_000})
    # Then the job fails hermes_rejected with the answer's status and text, and no attempt counted
    done = await settled(replica, job["run_id"])
    assert (done["status"], done["error"], done["attempts"]) == (
        "failed",
        {"code": "hermes_rejected", "message": NGINX_413},
        0,
    )
