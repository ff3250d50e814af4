"""Coalesced refreshes (SPEC S5.2): activity-only versions at most once per interval, state changes at once."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

from broker.simulator.state import Simulator
from tests.integration.board.conftest import BoardFactory, Post, Receiver
from tests.integration.driver.conftest import create, settled

REFRESH_MS = 1_000


def same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (a["state"], a["runId"], a["error"]) == (b["state"], b["runId"], b["error"])


async def test_fifty_tool_events_refresh_at_most_once_per_interval(
    make_board_replica: BoardFactory, receiver: Receiver, sim: Simulator
) -> None:
    # Given a one-second refresh interval and a run of 50 tool calls over about two seconds
    sim.settings.step_s = 0.02
    replica = await make_board_replica(board_refresh_interval_ms=REFRESH_MS)
    created = await create(replica, {"input": "busy work tools:50"})
    job_id = created["run_id"]
    await settled(replica, job_id, timeout=20)
    reports = await receiver.until(job_id, "done")
    posts: list[Post] = receiver.acknowledged(job_id)
    # Then each activity-only delivery came at least an interval after the key's previous delivery
    activity = 0
    for previous, current in pairwise(posts):
        if same_state(previous.report, current.report):
            activity += 1
            assert current.received_ms - previous.received_ms >= REFRESH_MS - 2, (previous.report, current.report)
    span_ms = posts[-1].received_ms - posts[0].received_ms
    assert 1 <= activity <= span_ms // REFRESH_MS + 1
    # and the newest activity went out, far fewer than the ~100 versions persisted
    ats = [report["at"] for report in reports]
    assert ats == sorted(set(ats)) and len(reports) < 10
    # and the terminal state went out at once, not at the next refresh
    done = posts[-1]
    assert done.report["state"] == "done"
    assert done.received_ms - done.report["at"] < REFRESH_MS / 2
