"""The operator console without a browser (SPEC S8): server-rendered pages with their data hooks, CSP,
escaping, no input or instructions, a 404 page, and CONSOLE_ENABLED=false. The browser suite is tests/browser."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient

from broker.console.routes import _environment
from tests.integration.conftest import ClientFactory

XSS = "<img src=x onerror=alert(1)>"
SECRET_INPUT = "secret-input-4711"
SECRET_INSTRUCTIONS = "secret-instructions-0815"


async def _create(client: TestClient[Any, Any], **body: Any) -> dict[str, Any]:
    answer = await client.post("/v1/runs", data=orjson.dumps({"input": SECRET_INPUT, **body}))
    assert answer.status == 202
    job: dict[str, Any] = await answer.json()
    return job


async def _html(client: TestClient[Any, Any], path: str, status: int = 200) -> str:
    answer = await client.get(path)
    assert answer.status == status
    assert answer.content_type == "text/html"
    assert answer.headers["Content-Security-Policy"] == "default-src 'self'"
    return await answer.text()


async def test_the_overview_lists_jobs_with_their_hooks(client: TestClient[Any, Any]) -> None:
    job = await _create(client, context={"title": XSS}, instructions=SECRET_INSTRUCTIONS)
    page = await _html(client, "/console")
    assert f'data-job-id="{job["run_id"]}"' in page
    assert f'href="/console/jobs/{job["run_id"]}"' in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and XSS not in page
    assert SECRET_INPUT not in page and SECRET_INSTRUCTIONS not in page
    assert "queue depth" in page and "board disabled" in page
    assert "<script>" not in page and "style=" not in page and "http" not in page.split("</head>")[0]


async def test_the_overview_filters_and_pages(client: TestClient[Any, Any]) -> None:
    jobs = [(await _create(client))["run_id"] for _ in range(3)]
    await asyncio.sleep(0.005)  # the stop is a later millisecond than every create
    assert (await client.post(f"/v1/runs/{jobs[0]}/stop")).status == 200
    page = await _html(client, "/console?status=cancelled")
    assert re.findall(r'data-job-id="([^"]+)"', page) == [jobs[0]]
    first = re.findall(r'data-job-id="([^"]+)"', html := await _html(client, "/console?limit=2"))
    assert len(first) == 2 and first[0] == jobs[0]  # the stopped job changed last
    next_link = re.search(r'rel="next" href="([^"]+)"', html)
    assert next_link is not None
    second = re.findall(r'data-job-id="([^"]+)"', await _html(client, next_link[1].replace("&amp;", "&")))
    assert sorted(first + second) == sorted(jobs)
    assert (await client.get("/console?limit=0")).status == 400


async def test_the_job_page_shows_the_object_and_the_replayed_timeline(client: TestClient[Any, Any]) -> None:
    job = await _create(client, context={"title": XSS}, instructions=SECRET_INSTRUCTIONS)
    page = await _html(client, f"/console/jobs/{job['run_id']}")
    assert 'data-field="status"' in page and ">queued<" in page
    assert 'data-action="stop"' in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and XSS not in page
    assert SECRET_INPUT not in page and SECRET_INSTRUCTIONS not in page
    async with client.get(f"/v1/runs/{job['run_id']}/events", timeout=2) as stream:
        first_frame = (await stream.content.readuntil(b"\n\n")).decode()
    sse_id = first_frame.split("id: ")[1].split("\n")[0]
    assert re.findall(r'data-event-id="([^"]+)"', page) == [sse_id]
    # A finished job has no Stop button
    assert (await client.post(f"/v1/runs/{job['run_id']}/stop")).status == 200
    done = await _html(client, f"/console/jobs/{job['run_id']}")
    assert 'data-action="stop"' not in done and ">cancelled<" in done
    async with client.get(f"/v1/runs/{job['run_id']}/events", timeout=2) as stream:
        sse_ids = re.findall(r"^id: (\S+)$", await stream.text(), flags=re.MULTILINE)
    assert re.findall(r'data-event-id="([^"]+)"', done) == sse_ids and len(sse_ids) == 3


@pytest.mark.parametrize("job_id", ["job_0123456789abcdef0123456789abcdef", "nope", "<b>"])
async def test_an_unknown_job_is_a_404_page(client: TestClient[Any, Any], job_id: str) -> None:
    page = await _html(client, f"/console/jobs/{job_id}", status=404)
    assert "No such job" in page and "<b>" not in page.split("<body>")[1]


async def test_the_script_and_stylesheet_are_served(client: TestClient[Any, Any]) -> None:
    for name, content_type in (("console.js", "text/javascript"), ("console.css", "text/css")):
        answer = await client.get(f"/console/static/{name}")
        assert answer.status == 200 and answer.content_type == content_type
        assert answer.headers["Content-Security-Policy"] == "default-src 'self'"
    assert (await client.get("/console/static/../routes.py")).status == 404


async def test_console_disabled_answers_404_in_the_envelope(make_client: ClientFactory) -> None:
    client = await make_client(console_enabled=False)
    for path in ("/console", "/console/jobs/job_x", "/console/static/console.js"):
        answer = await client.get(path)
        assert answer.status == 404 and answer.content_type == "application/json"
        assert (await answer.json())["error"]["code"] == "not_found"


def test_the_admission_state_renders_as_a_table_when_present() -> None:
    admission = {"live": 3, "limit": 10, "learnt": True, "refusing": False, "reason": None, "line": "<x>"}
    html = (
        _environment()
        .get_template("overview.html")
        .render(
            report={"status": "ready", "queue_depth": 4, "hermes_answered": True},
            admission=admission,
            held={"busy": 2},
            held_scanned=400,
            board_lag=7,
            rows=[],
            status="",
            limit=50,
            next_cursor=None,
            filters=("",),
        )
    )
    assert "<th>live</th><td>3</td>" in html and "<th>limit</th><td>10</td>" in html
    assert "<th>refusing</th><td>false</td>" in html and "&lt;x&gt;" in html
    assert "busy: 2 (among the 400 most recently changed queued jobs)" in html and ">7<" in html


def test_the_overview_shows_waiting_jobs_by_priority_and_the_top_fairness_keys() -> None:
    admission = {
        "live": 1,
        "waiting_by_priority": {"1": 2, "2": 0, "3": 7, "4": 0, "5": 1},
        "top_keys": [{"key": "<team>", "waiting": 6, "weight": 3.0}, {"key": "", "waiting": 4, "weight": 1.0}],
    }
    html = (
        _environment()
        .get_template("overview.html")
        .render(
            report={"status": "ready", "hermes_answered": True},
            admission=admission,
            held={},
            held_scanned=0,
            board_lag=None,
            rows=[],
            status="",
            limit=50,
            next_cursor=None,
            filters=("",),
        )
    )
    assert 'data-field="waiting_by_priority">1: 2, 2: 0, 3: 7, 4: 0, 5: 1<' in html
    assert "<td>&lt;team&gt;</td><td>6</td><td>3.0</td>" in html and "<td>(none)</td><td>4</td>" in html
    assert "top_keys" not in html


async def test_a_turns_page_lists_its_session_in_order(
    client: TestClient[Any, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given three turns of one session (nothing drives them: the first holds the session, the others wait)
    session = "<s&1>"
    turns = [(await _create(client, session_id=session))["run_id"] for _ in range(3)]
    # When the second turn's page is read
    page = await _html(client, f"/console/jobs/{turns[1]}")
    # Then the turns are listed in order, the holder marked, the waiting ones with their hold, the session escaped
    rows = re.findall(r'data-turn-id="([^"]+)" data-turn-place="([^"]+)"( data-current="true")?', page)
    assert rows == [(turns[0], "holder", ""), (turns[1], "waiting", ' data-current="true"'), (turns[2], "waiting", "")]
    assert f'data-turn-hold="session">session · Waiting for {turns[0]} of session &lt;s&amp;1&gt;.</td>' in page
    assert 'data-session-id="&lt;s&amp;1&gt;"' in page and session not in page
    assert f'<a href="/console/jobs/{turns[2]}">' in page and SECRET_INPUT not in page
    # When the first turn is stopped (a cancelled turn is no completed turn) and only one unfinished turn is listed
    assert (await client.post(f"/v1/runs/{turns[0]}/stop")).status == 200
    monkeypatch.setattr("broker.console.data.SESSION_TURNS", 1)
    page = await _html(client, f"/console/jobs/{turns[2]}")
    # Then the second turn holds the session and the third is counted
    assert re.findall(r'data-turn-id="([^"]+)" data-turn-place="([^"]+)"', page) == [(turns[1], "holder")]
    assert "And 1 more unfinished turn after these." in page


async def test_a_job_without_a_session_shows_no_turns(client: TestClient[Any, Any]) -> None:
    job = await _create(client)
    page = await _html(client, f"/console/jobs/{job['run_id']}")
    assert 'data-region="session"' not in page and "data-turn-id" not in page
