"""A conversation's turns in the console, in a real headless Chromium (SPEC S4.3, S8): a job page lists its session's
turns in order with the holder marked and a waiting turn's hold `session`; the job list shows that hold; the page
follows the session when the turn's own comes."""

from __future__ import annotations

from typing import Any

from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from tests.e2e.browser.conftest import eventually
from tests.e2e.browser.test_console import create, job, status_text
from tests.e2e.conftest import BrokerProcess

ROWS = """return Array.from(document.querySelectorAll('[data-turn-id]'), (row) => ({
  id: row.dataset.turnId, place: row.dataset.turnPlace, current: row.dataset.current === "true",
  href: row.querySelector("a").href, text: row.innerText,
  hold: row.querySelector("[data-turn-hold]").dataset.turnHold,
  hold_text: row.querySelector("[data-turn-hold]").innerText,
}));"""


def rows(driver: WebDriver) -> list[dict[str, Any]]:
    """The session's turns on a job page, top to bottom, read in one script (the live page swaps the list in)."""
    return list(driver.execute_script(ROWS))


def turns(driver: WebDriver) -> list[tuple[str, str]]:
    """The session's turns on a job page: (job id, place), top to bottom."""
    return [(row["id"], row["place"]) for row in rows(driver)]


def list_holds(driver: WebDriver) -> dict[str, str]:
    """The job list's hold column: job id -> hold reason."""
    script = "return Object.fromEntries(Array.from(document.querySelectorAll('tr[data-job-id]'),"
    script += " (row) => [row.dataset.jobId, row.cells[2].innerText]));"
    return dict(driver.execute_script(script))


def test_a_turns_page_lists_its_session_in_order_with_the_holder_and_follows_it(
    broker: BrokerProcess, browser: WebDriver
) -> None:
    # Given three turns of one session, the first a slow one
    first = create(broker, "slow sleep:5", session_id="s-console")
    second = create(broker, "second", session_id="s-console")
    third = create(broker, "third", session_id="s-console")
    eventually(lambda: job(broker, first)["status"] == "running", what="the first turn running")
    assert job(broker, second)["hold"]["reason"] == "session"
    # When the second turn's page is opened
    browser.get(f"{broker.url}/console/jobs/{second}")
    # Then the session's turns are listed in order, the first holding the session, the second marked as this job
    listed = rows(browser)
    assert [(row["id"], row["place"]) for row in listed] == [(first, "holder"), (second, "waiting"), (third, "waiting")]
    assert [row["id"] for row in listed if row["current"]] == [second]
    assert [row["href"] for row in listed] == [f"{broker.url}/console/jobs/{turn}" for turn in (first, second, third)]
    section = browser.find_element(By.CSS_SELECTOR, '[data-region="session"]')
    assert section.get_attribute("data-session-id") == "s-console"
    assert "running" in listed[0]["text"] and "holds the session" in listed[0]["text"] and listed[0]["hold"] == ""
    assert [row["hold"] for row in listed[1:]] == ["session", "session"]
    assert listed[1]["hold_text"] == f"session · Waiting for {first} of session s-console."
    # And the page's own hold shows the reason `session` and its detail, as other holds do
    own = browser.find_element(By.CSS_SELECTOR, '[data-field="hold"]').text
    assert '"reason":"session"' in own and f"Waiting for {first} of session s-console." in own
    # And the job list shows the waiting turns' hold reason
    browser.get(f"{broker.url}/console")
    holds = list_holds(browser)
    assert holds[second] == holds[third] == "session" and holds[first] == ""
    # When the first turn completes, the second turn's page follows its session without a reload
    browser.get(f"{broker.url}/console/jobs/{second}")
    browser.execute_script("window.__sameDocument = true")
    eventually(lambda: status_text(browser) in ("running", "completed"), timeout=30, what="the second turn's run")
    eventually(
        lambda: turns(browser)[0] == (first, "completed") and dict(turns(browser))[second] in ("holder", "completed"),
        what="the session moved on",
    )
    assert browser.execute_script("return window.__sameDocument") is True
    eventually(lambda: job(broker, third)["status"] == "completed", timeout=30, what="the last turn")
