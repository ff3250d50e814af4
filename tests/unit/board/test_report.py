"""Board report rendering (SPEC S5): exact bytes, key order, omissions, determinism."""

from __future__ import annotations

import orjson
from hypothesis import given

from broker.board.report import is_active, render
from broker.codec import decode, encode
from broker.events import Context, JobEvent, JobStatus, Link, Reporting, RunAccepted
from projections.board import BoardVersion, EntryState, fold
from tests.strategies_board import BASE_MS, JOB_ID, created, finished, histories

ORDER = [
    "key",
    "platform",
    "sessionId",
    "state",
    "title",
    "link",
    "links",
    "error",
    "runId",
    "at",
    "sourceActivityAt",
    "reporting",
]


def latest(events: list[JobEvent]) -> BoardVersion:
    version = fold(events).version
    assert version is not None
    return version


def test_full_report_bytes() -> None:
    context = Context(
        title="Review staging promotion", url="https://g.example/mr/7", links=[Link("MR", "https://g.example")]
    )
    accept = RunAccepted(job_id=JOB_ID, at_ms=BASE_MS + 50, attempt=1, hermes_run_id="run_c60d")
    version = latest([created(context=context, session_id="s-1"), accept])
    assert render(version, "runs") == (
        b'{"key":"runs-' + JOB_ID.encode() + b'","platform":"runs","sessionId":"s-1","state":"running",'
        b'"title":"Review staging promotion","link":"https://g.example/mr/7",'
        b'"links":[{"text":"MR","url":"https://g.example"}],"error":null,"runId":"run_c60d",'
        b'"at":1796005747441,"sourceActivityAt":1796005747441,"reporting":{"board":true,"post":true}}'
    )


def test_minimal_report_omits_what_the_job_lacks() -> None:
    version = latest([created(reporting=Reporting(board=False, post=False))])
    assert orjson.loads(render(version, "ci")) == {
        "key": f"runs-{JOB_ID}",
        "platform": "ci",
        "state": "running",
        "title": f"runs-{JOB_ID}",
        "error": None,
        "runId": None,
        "at": BASE_MS,
        "sourceActivityAt": BASE_MS,
        "reporting": {"board": False, "post": False},
    }


def test_failed_and_denied_reports_carry_their_error() -> None:
    failed = latest([created(), finished(BASE_MS + 1, JobStatus.FAILED, "hermes_rejected", "bad model")])
    denied = latest([created(), finished(BASE_MS + 1, JobStatus.CANCELLED, "approval_denied", "rm -rf /")])
    assert orjson.loads(render(failed, "runs"))["error"] == "bad model"
    assert orjson.loads(render(denied, "runs"))["state"] == "approval_denied"
    assert orjson.loads(render(denied, "runs"))["error"] == "rm -rf /"
    assert not is_active(failed) and not is_active(denied)


def test_an_empty_links_list_is_kept_as_given() -> None:
    version = latest([created(context=Context(title="t", links=[]))])
    assert orjson.loads(render(version, "runs"))["links"] == []


@given(histories())
def test_keys_follow_the_contract_order(events: list[JobEvent]) -> None:
    version = latest(events)
    report = orjson.loads(render(version, "runs"))
    assert list(report) == [key for key in ORDER if key in report]
    assert {"key", "platform", "state", "title", "error", "runId", "at", "sourceActivityAt", "reporting"} <= set(report)
    assert report["state"] == version.state.value
    assert is_active(version) == (version.state is EntryState.RUNNING)


@given(histories())
def test_rebuilding_from_the_stream_renders_the_same_bytes(events: list[JobEvent]) -> None:
    rebuilt = [decode(encode(event)) for event in events]
    assert render(latest(rebuilt), "runs") == render(latest(events), "runs")
