"""Board reports of driven jobs (SPEC S5.1, S5.2): state sequences, fields, versions, reporting flags."""

from __future__ import annotations

from typing import Any

from broker.simulator.script import DANGEROUS_COMMAND, FAILURE
from tests.conftest import BOTH_BACKENDS
from tests.integration.board.conftest import ALWAYS, REPORT_KEYS, BoardFactory, Receiver, deliveries, until_true
from tests.integration.driver.conftest import create, eventually, settled

pytestmark = BOTH_BACKENDS

CONTEXT = {
    "title": "Review staging promotion",
    "url": "https://ci.example/pipelines/7",
    "links": [{"text": "MR !12", "url": "https://git.example/mr/12"}],
}


def states(reports: list[dict[str, Any]]) -> list[str]:
    """The state sequence without repeats."""
    sequence: list[str] = []
    for report in reports:
        if not sequence or sequence[-1] != report["state"]:
            sequence.append(report["state"])
    return sequence


def check_versions(reports: list[dict[str, Any]]) -> None:
    ats = [report["at"] for report in reports]
    assert ats == sorted(set(ats)), "at strictly increases per key"
    sources = [report["sourceActivityAt"] for report in reports]
    assert sources == sorted(sources), "sourceActivityAt never decreases"
    for report in reports:
        assert ALWAYS <= set(report) <= set(REPORT_KEYS)
        assert list(report) == [key for key in REPORT_KEYS if key in report], "contract key order"


async def test_a_completed_job_reports_running_then_done(make_board_replica: BoardFactory, receiver: Receiver) -> None:
    # Given a replica reporting to the receiver
    replica = await make_board_replica()
    # When a job with context and a session completes
    # (its reply takes a second: a newer version supersedes a pending one, and a job done within the sender's
    # first turn would report `done` alone, S5.3)
    created = await create(replica, {"input": "hello tools:2 sleep:1", "session_id": "s-1", "context": CONTEXT})
    job_id = created["run_id"]
    done = await settled(replica, job_id)
    # Then the receiver got running ... done, with every S5 field
    reports = await receiver.until(job_id, "done")
    assert states(reports) == ["running", "done"]
    check_versions(reports)
    first, last = reports[0], reports[-1]
    # the creation version, unless Hermes accepted the run before the sender took it: then the newer version
    # (with the run) superseded it as the key's pending delivery, and the receiver sees that one first
    assert first["runId"] in (None, done["hermes_run_id"])
    if first["runId"] is None:
        assert first["sourceActivityAt"] == first["at"]
    assert set(last) == set(REPORT_KEYS)
    assert last["key"] == f"runs-{job_id}" and last["platform"] == "runs" and last["sessionId"] == "s-1"
    assert last["title"] == CONTEXT["title"] and last["link"] == CONTEXT["url"] and last["links"] == CONTEXT["links"]
    assert last["runId"] == done["hermes_run_id"] and last["error"] is None
    assert last["reporting"] == {"board": True, "post": True}
    assert all(post.content_type == "application/json" for post in receiver.posts)
    # the receiver records a POST before its answer reaches the sender, which counts it then
    await until_true(lambda: deliveries(replica, "delivered") == len(reports))


async def test_a_failed_job_reports_the_failure(make_board_replica: BoardFactory, receiver: Receiver) -> None:
    replica = await make_board_replica()
    created = await create(replica, {"input": "please fail"})
    reports = await receiver.until(created["run_id"], "failed")
    # the running version goes out unless the failure superseded it while it was pending (S5: the latest
    # version at least once; a run that fails at once on a loaded cluster, where the sender's bell is a hint)
    assert states(reports) in (["running", "failed"], ["failed"])
    check_versions(reports)
    assert reports[-1]["error"] == FAILURE
    assert reports[-1]["title"] == f"runs-{created['run_id']}" and "link" not in reports[-1]
    assert "links" not in reports[-1] and "sessionId" not in reports[-1]


async def test_a_stopped_job_reports_stopped(make_board_replica: BoardFactory, receiver: Receiver) -> None:
    replica = await make_board_replica()
    created = await create(replica, {"input": "slow sleep:5"})
    job_id = created["run_id"]
    await receiver.running_with_run(job_id)
    answer = await replica.post(f"/v1/runs/{job_id}/stop")
    assert answer.status == 200
    reports = await receiver.until(job_id, "stopped")
    assert states(reports) == ["running", "stopped"]
    check_versions(reports)
    assert reports[-1]["error"] is None


async def test_a_denied_approval_reports_the_command(make_board_replica: BoardFactory, receiver: Receiver) -> None:
    replica = await make_board_replica()
    created = await create(replica, {"input": "please approval"})
    job_id = created["run_id"]

    async def waiting() -> bool:
        return (await (await replica.get(f"/v1/runs/{job_id}")).json())["status"] == "waiting_for_approval"

    await eventually(waiting)
    answer = await replica.post(f"/v1/runs/{job_id}/approval", json={"choice": "deny"})
    assert answer.status == 200
    reports = await receiver.until(job_id, "approval_denied")
    # the running version goes out unless the denial superseded it while it was pending (S5: the latest
    # version at least once; seen on a loaded cluster, where the sender's bell is a hint)
    assert states(reports) in (["running", "approval_denied"], ["approval_denied"])
    check_versions(reports)
    assert reports[-1]["error"] == DANGEROUS_COMMAND


async def test_reporting_flags_false_are_still_delivered(make_board_replica: BoardFactory, receiver: Receiver) -> None:
    replica = await make_board_replica(board_platform="ci-runs")
    body = {"input": "hello", "context": {"title": "Quiet"}, "reporting": {"board": False, "post": False}}
    created = await create(replica, body)
    reports = await receiver.until(created["run_id"], "done")
    assert all(report["reporting"] == {"board": False, "post": False} for report in reports)
    assert all(report["platform"] == "ci-runs" and report["title"] == "Quiet" for report in reports)
    assert all("link" not in report and "links" not in report for report in reports)
