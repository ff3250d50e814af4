"""The console's usage page in a real headless Chromium (SPEC S4.5, S8): reached from the navigation, a chart of the
keys that used most Hermes time over 24 h and 7 d, drawn without scripts or external assets, every key escaped."""

from __future__ import annotations

from typing import Any

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.e2e.browser.conftest import eventually, requested_urls
from tests.e2e.conftest import BrokerProcess

XSS_KEY = "<img/src=x/onerror=alert(1)>"  #: a valid fairness key (visible ASCII) that is also markup
JSON = {"Content-Type": "application/json"}


def create(broker: BrokerProcess, text: str, key: str) -> str:
    status, job = broker.request("POST", "/v1/runs", {"input": text, "scheduling": {"fairness_key": key}}, **JSON)
    assert status == 202, job
    return str(job["run_id"])


def ended(broker: BrokerProcess, job_id: str) -> bool:
    return broker.request("GET", f"/v1/runs/{job_id}")[1]["status"] == "completed"


def usage_keys(broker: BrokerProcess) -> list[dict[str, Any]]:
    status, body = broker.request("GET", "/v1/usage")
    assert status == 200
    return list(body["data"])


def bars(browser: WebDriver, window: str) -> dict[str, float]:
    section = browser.find_element(By.CSS_SELECTOR, f'section[data-window="{window}"]')
    found = {}
    for group in section.find_elements(By.CSS_SELECTOR, "svg g[data-key]"):
        rect = group.find_element(By.TAG_NAME, "rect")
        found[str(group.get_attribute("data-key"))] = float(str(rect.get_attribute("width")))
    return found


def test_the_usage_page_charts_the_keys_that_used_most(broker: BrokerProcess, browser: WebDriver) -> None:
    # Given runs of three keys: one long, one short, one whose name is markup
    jobs = [
        create(broker, "sleep:2", "team-long"),
        create(broker, "hello", "team-short"),
        create(broker, "hi", XSS_KEY),
    ]
    eventually(lambda: all(ended(broker, job_id) for job_id in jobs), what="every job")
    eventually(lambda: [entry["runs_completed"] for entry in usage_keys(broker)] == [1, 1, 1], what="the usage")
    # When the usage page is opened from the console's navigation
    browser.get(f"{broker.url}/console")
    requested_urls(browser)  # drop the overview's requests
    browser.find_element(By.CSS_SELECTOR, 'header a[data-nav="usage"]').click()
    eventually(lambda: browser.current_url.endswith("/console/usage"), what="the usage page")
    assert browser.find_element(By.TAG_NAME, "h1").text == "Usage"
    # Then both windows chart the three keys, the longest bar for the key that used most Hermes time
    for window in ("24 h", "7 d"):
        widths = bars(browser, window)
        assert set(widths) == {"team-long", "team-short", XSS_KEY}
        assert widths["team-long"] == max(widths.values()) > widths["team-short"] > 0
        rows = browser.find_elements(By.CSS_SELECTOR, f'section[data-window="{window}"] table.usage tbody tr')
        assert rows[0].get_attribute("data-key") == "team-long"
    # And the markup key shows as text: no element was made of it, no script ran
    assert XSS_KEY in browser.find_element(By.CSS_SELECTOR, "table.usage").text
    assert browser.find_elements(By.CSS_SELECTOR, "main img") == []
    assert browser.execute_script("return document.querySelectorAll('svg text').length") >= 6
    # And the page loaded nothing but the broker's own resources
    assert all(url.startswith(broker.url) for url in requested_urls(browser))
    errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
    assert not [entry for entry in errors if "favicon.ico" not in entry["message"]]  # the browser's own guess
