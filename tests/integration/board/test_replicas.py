"""Two replicas delivering the same keys (SPEC S5.3): never an older version after a newer one was acknowledged."""

from __future__ import annotations

import asyncio

from tests.conftest import BOTH_BACKENDS
from tests.integration.board.conftest import BoardFactory, Receiver
from tests.integration.driver.conftest import create

pytestmark = BOTH_BACKENDS

JOBS = 6


async def test_two_replicas_never_deliver_an_older_version_after_a_newer_one(
    make_board_replica: BoardFactory, receiver: Receiver
) -> None:
    # Given two replicas, every activity delivered at once, frequent reconciliation, and a jittery receiver
    receiver.jitter_s = 0.015
    settings = {"board_refresh_interval_ms": 0, "board_reconcile_interval_ms": 700}
    replicas = [await make_board_replica(**settings), await make_board_replica(**settings)]
    # When jobs with tool activity run on both
    created = await asyncio.gather(*(create(replicas[i % 2], {"input": f"job {i} tools:4"}) for i in range(JOBS)))
    # Then every key ends done, and the receiver never acknowledged an `at` older than one it had
    for job in created:
        reports = await receiver.until(job["run_id"], "done")
        # versions that piled up while a key was locked coalesce into its latest one; order is never lost
        assert reports[-1]["state"] == "done"
    assert receiver.regressions == []
