"""Quotas in the console, in a real headless Chromium (SPEC S4.4, S8): the overview lists each key's use of its quota,
the key at its limit first, and the job list shows a held job's hold `quota`."""

from __future__ import annotations

from typing import Any

from selenium.webdriver.remote.webdriver import WebDriver

from tests.conftest import RedisServer
from tests.e2e.browser.conftest import FAST, eventually
from tests.e2e.browser.test_console import create, job
from tests.e2e.browser.test_console_sessions import list_holds
from tests.e2e.conftest import BrokerFactory, SimulatorProcess

QUOTAS = '{"keys": {"team-a": {"live": 1, "waiting": 50}, "team-b": {"live": 5}}}'
ROWS = """return Array.from(document.querySelectorAll('[data-region="quotas"] tr[data-quota-key]'), (row) => ({
  key: row.dataset.quotaKey, live: row.querySelector('[data-field="live"]').innerText,
  held: row.querySelector('[data-field="held"]').innerText, text: row.innerText,
}));"""


def test_the_overview_shows_a_key_at_its_quota_first_and_its_held_jobs(
    clean_redis: RedisServer, simulator: SimulatorProcess, start_broker: BrokerFactory, browser: WebDriver
) -> None:
    # Given a broker where team-a may have one live run and team-b five
    broker = start_broker(
        redis_url=clean_redis.url, HERMES_URL=simulator.url, HERMES_TIMEOUT="5000", ADMISSION_QUOTAS=QUOTAS, **FAST
    )
    # When team-a has a long run live and two more jobs
    running = create(broker, "slow sleep:20", scheduling={"fairness_key": "team-a"})
    eventually(lambda: job(broker, running)["status"] == "running", what="team-a's first run live")
    waiting = [create(broker, f"next {i}", scheduling={"fairness_key": "team-a"}) for i in range(2)]
    eventually(
        lambda: all((job(broker, j)["hold"] or {}).get("reason") == "quota" for j in waiting), what="held by quota"
    )
    # Then the overview lists team-a first, at its limit with its jobs held, then team-b with room
    browser.get(f"{broker.url}/console")
    rows: list[dict[str, Any]] = browser.execute_script(ROWS)
    assert [row["key"] for row in rows] == ["team-a", "team-b"]
    assert rows[0]["live"] == "1 / 1" and rows[0]["held"] == "2 (quota)" and "2 / 50" in rows[0]["text"]
    assert rows[1]["live"] == "0 / 5" and rows[1]["held"] == "0"
    # And the job list shows the held jobs' hold
    holds = list_holds(browser)
    assert [holds[j] for j in waiting] == ["quota", "quota"]
