"""The `hermes` target fixture: every contract test runs against the simulator and the real Hermes 0.19.0."""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Iterator

import pytest

from broker.hermes import AiohttpHermesClient
from tests.contract.harness import HarnessError, Target, start_target

REQUEST_TIMEOUT_MS = 10_000


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("sim"),
        # The first real run installs hermes-agent into its own virtualenv, hence the long timeout.
        pytest.param("real", marks=[pytest.mark.real_hermes, pytest.mark.timeout(300)]),
    ],
)
def hermes(request: pytest.FixtureRequest) -> Iterator[Target]:
    try:
        target, workdir = start_target(request.param)
    except (HarnessError, OSError, subprocess.SubprocessError) as exc:
        reason = f"could not start the {request.param} Hermes target: {exc}"
        if os.environ.get("CI") or request.param == "sim":  # the simulator is ours: it must always start
            pytest.fail(reason)
        print(reason)
        pytest.skip(reason)
    yield target
    target.close()
    workdir.cleanup()


@pytest.fixture
async def client(hermes: Target) -> AsyncIterator[AiohttpHermesClient]:
    client = AiohttpHermesClient(hermes.base_url, hermes.api_key, REQUEST_TIMEOUT_MS)
    yield client
    await client.aclose()
