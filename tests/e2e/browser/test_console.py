"""The operator console in a real headless Chromium (SPEC S8), against a broker process, Redis and the
simulator: live overview, replayed-then-live timeline with the SSE route's ids, live status, Stop, escaping,
no network but the broker, and cross-site requests from another origin refused without effect."""

from __future__ import annotations

import http.server
import json
import re
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.conftest import RedisServer, free_port
from tests.e2e.browser.conftest import FAST, eventually, requested_urls, sim_settings
from tests.e2e.conftest import BrokerFactory, BrokerProcess, SimulatorProcess

XSS = "<img src=x onerror=alert(1)>"
JSON = {"Content-Type": "application/json"}


def create(broker: BrokerProcess, text: str, **body: Any) -> str:
    status, job = broker.request("POST", "/v1/runs", {"input": text, **body}, **JSON)
    assert status == 202, job
    run_id: str = job["run_id"]
    return run_id


def job(broker: BrokerProcess, job_id: str) -> dict[str, Any]:
    status, body = broker.request("GET", f"/v1/runs/{job_id}")
    assert status == 200
    return dict(body)


def sse_ids(broker: BrokerProcess, job_id: str) -> list[str]:
    """The ids the SSE route sends for a finished job (it replays everything and closes)."""
    with urllib.request.urlopen(f"{broker.url}/v1/runs/{job_id}/events", timeout=10) as stream:
        return re.findall(r"^id: (\S+)$", stream.read().decode(), flags=re.MULTILINE)


def page_ids(driver: WebDriver) -> list[str]:
    return [str(li.get_attribute("data-event-id")) for li in driver.find_elements(By.CSS_SELECTOR, "[data-event-id]")]


def status_text(driver: WebDriver) -> str:
    return str(driver.find_element(By.CSS_SELECTOR, '[data-field="status"]').text)


def assert_no_alert(driver: WebDriver) -> None:
    with pytest.raises(NoAlertPresentException):
        driver.switch_to.alert  # noqa: B018  # raises when no dialog is open


def test_the_overview_lists_a_new_job_without_a_reload(broker: BrokerProcess, browser: WebDriver) -> None:
    browser.get(f"{broker.url}/console")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Overview"
    browser.execute_script("window.__sameDocument = true")
    job_id = create(broker, "hello", context={"title": "A new job"})
    row = eventually(lambda: browser.find_elements(By.CSS_SELECTOR, f'tr[data-job-id="{job_id}"]'), what="the row")
    assert "A new job" in row[0].text
    assert browser.execute_script("return window.__sameDocument") is True  # updated in place, not reloaded
    link = row[0].find_element(By.TAG_NAME, "a")
    link.click()
    eventually(lambda: browser.current_url.endswith(f"/console/jobs/{job_id}"), what="the job page")


def test_the_timeline_replays_then_follows_live_and_the_status_turns_completed(
    broker: BrokerProcess, simulator: SimulatorProcess, browser: WebDriver
) -> None:
    # Given a job that has recorded some events and will record more for a few seconds
    sim_settings(simulator, step_s=0.4)
    job_id = create(broker, "tools:3 sleep:3")
    eventually(lambda: job(broker, job_id)["last_event"] == "tool.started", what="the first tool call")
    # When its page is opened
    browser.get(f"{broker.url}/console/jobs/{job_id}")
    browser.execute_script("window.__sameDocument = true")
    replayed = page_ids(browser)
    assert len(replayed) >= 3  # job.queued, job.accepted, tool.started at least, rendered by the server
    assert status_text(browser) == "running"
    # Then the status turns completed without a reload, and the timeline is the SSE route's, in order, once
    eventually(lambda: status_text(browser) == "completed", timeout=30, what="completed")
    assert browser.execute_script("return window.__sameDocument") is True
    expected = sse_ids(broker, job_id)
    eventually(lambda: page_ids(browser) == expected, what="the whole timeline")
    assert len(expected) > len(replayed) and expected[: len(replayed)] == replayed
    assert len(set(expected)) == len(expected)
    assert browser.find_elements(By.CSS_SELECTOR, '[data-action="stop"]') == []
    events = [li.find_element(By.CLASS_NAME, "event").text for li in browser.find_elements(By.CSS_SELECTOR, "li")]
    assert events[0] == "job.queued" and events[-1] == "run.completed"


def test_stop_ends_a_long_job_cancelled(broker: BrokerProcess, browser: WebDriver) -> None:
    job_id = create(broker, "sleep:30")
    eventually(lambda: job(broker, job_id)["status"] == "running", what="running")
    browser.get(f"{broker.url}/console/jobs/{job_id}")
    browser.find_element(By.CSS_SELECTOR, '[data-action="stop"]').click()
    eventually(lambda: status_text(browser) == "cancelled", timeout=20, what="cancelled")
    assert job(broker, job_id)["status"] == "cancelled"
    assert job(broker, job_id)["error"]["code"] == "stopped"
    eventually(lambda: page_ids(browser) == sse_ids(broker, job_id), what="the timeline up to run.cancelled")
    assert browser.find_elements(By.CSS_SELECTOR, '[data-action="stop"]') == []


def test_a_hostile_title_renders_as_text(broker: BrokerProcess, browser: WebDriver) -> None:
    job_id = create(broker, "hello", context={"title": XSS})
    browser.get(f"{broker.url}/console")
    row = browser.find_element(By.CSS_SELECTOR, f'tr[data-job-id="{job_id}"]')
    assert XSS in row.text
    assert_no_alert(browser)
    browser.get(f"{broker.url}/console/jobs/{job_id}")
    assert browser.find_element(By.TAG_NAME, "h1").text == XSS
    assert browser.find_elements(By.TAG_NAME, "img") == []
    eventually(lambda: status_text(browser) == "completed", what="completed")
    assert_no_alert(browser)


def test_the_pages_load_with_only_the_broker_reachable(broker: BrokerProcess, browser: WebDriver) -> None:
    job_id = create(broker, "tools:1")
    eventually(lambda: job(broker, job_id)["status"] == "completed", what="completed")
    requested_urls(browser)  # drop anything logged before
    for path in ("/console", f"/console/jobs/{job_id}"):
        browser.get(broker.url + path)
        # The served stylesheet applied and the served script ran (nothing else was there to load)
        assert browser.execute_script("return document.styleSheets[0].cssRules.length") > 0
    browser.get(f"{broker.url}/console")
    eventually(lambda: requested_urls(browser).count(f"{broker.url}/console") >= 1, what="the live refresh")
    browser.get(f"{broker.url}/console/jobs/{job_id}")
    urls = requested_urls(browser)
    assert urls and all(url.startswith(f"{broker.url}/") for url in urls), urls
    # And the rest of the network is really closed to this browser
    outside = browser.execute_async_script(
        "const done = arguments[0];"
        "fetch('http://example.com/', {mode: 'no-cors'}).then(() => done('reached'), () => done('blocked'));"
    )
    assert outside == "blocked"


@pytest.fixture
def other_site() -> Iterator[tuple[str, dict[str, str]]]:
    """A page on another origin (127.0.0.2) whose script is set per test in the returned dict."""
    page: dict[str, str] = {"html": ""}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page["html"].encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.2", free_port()), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.2:{server.server_address[1]}", page
    server.shutdown()
    server.server_close()


def refused(broker: BrokerProcess, path: str) -> bool:
    """Whether the broker's log has a POST to `path` answered 403."""
    for line in broker.log_path.read_text().splitlines():
        fields = json.loads(line) if line.startswith("{") else {}
        if fields.get("message") == "Answered a request." and (fields.get("method"), fields.get("path")) == (
            "POST",
            path,
        ):
            if fields.get("status") == 403:
                return True
    return False


def test_a_cross_site_page_cannot_create_stop_or_answer_approvals(
    broker: BrokerProcess, browser: WebDriver, other_site: tuple[str, dict[str, str]]
) -> None:
    # Given a running job and one waiting for approval
    running = create(broker, "sleep:30")
    waiting = create(broker, "approval")
    eventually(lambda: job(broker, running)["status"] == "running", what="running")
    eventually(lambda: job(broker, waiting)["status"] == "waiting_for_approval", what="waiting for approval")
    before = broker.request("GET", "/v1/runs")[1]["data"]
    # When a page of another site posts a create, a stop and a denial to the broker (simple requests: no preflight)
    origin, page = other_site
    page["html"] = f"""<!doctype html><title>other</title><script>
const broker = {json.dumps(broker.url)};
const post = (path, body) => fetch(broker + path, {{method: "POST", mode: "no-cors", body,
  headers: {{"Content-Type": "text/plain"}}}}).catch(() => null);
Promise.all([
  post("/v1/runs", JSON.stringify({{input: "from another site"}})),
  post("/v1/runs/{running}/stop", ""),
  post("/v1/runs/{waiting}/approval", JSON.stringify({{choice: "deny"}})),
]).then(() => {{ document.title = "sent"; }});
</script>"""
    browser.get(f"{origin}/")
    eventually(lambda: browser.title == "sent", what="the other site's requests")
    # Then each request reached the broker and was refused
    for path in ("/v1/runs", f"/v1/runs/{running}/stop", f"/v1/runs/{waiting}/approval"):
        eventually(lambda path=path: refused(broker, path), what=f"a 403 for {path}")
    # And nothing changed
    assert job(broker, running)["status"] == "running"
    assert job(broker, waiting)["status"] == "waiting_for_approval"
    assert [j["run_id"] for j in broker.request("GET", "/v1/runs")[1]["data"]] == [j["run_id"] for j in before]
    # While the broker's own page may still stop the job (same origin)
    browser.get(f"{broker.url}/console/jobs/{running}")
    browser.find_element(By.CSS_SELECTOR, '[data-action="stop"]').click()
    eventually(lambda: job(broker, running)["status"] == "cancelled", what="cancelled from the console")
    broker.request("POST", f"/v1/runs/{waiting}/stop")


def test_the_timeline_resumes_after_the_broker_restarts(
    clean_redis: RedisServer, simulator: SimulatorProcess, start_broker: BrokerFactory, browser: WebDriver
) -> None:
    # Given a job page following a live job
    port = free_port()
    first = start_broker(redis_url=clean_redis.url, port=port, HERMES_URL=simulator.url, **FAST)
    sim_settings(simulator, step_s=0.3)
    job_id = create(first, "tools:4 sleep:4")
    eventually(lambda: job(first, job_id)["status"] == "running", what="running")
    browser.get(f"{first.url}/console/jobs/{job_id}")
    eventually(lambda: len(page_ids(browser)) >= 3, what="some events")
    # When the broker drains (its event streams end without a terminal event) and comes back on the same port
    assert first.terminate() == 0
    second = start_broker(redis_url=clean_redis.url, port=port, HERMES_URL=simulator.url, **FAST)
    # Then the page resumes with Last-Event-ID: every event once, in order, up to the job's end
    eventually(lambda: status_text(browser) == "completed", timeout=40, what="completed after the restart")
    expected = sse_ids(second, job_id)
    eventually(lambda: page_ids(browser) == expected, what="the whole timeline")
    assert len(set(expected)) == len(expected)
