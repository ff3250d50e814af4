"""Browser fixtures: Debian's headless Chromium driven by Selenium against a broker process, Redis and the
simulator (the e2e conftest's `simulator` and `clean_redis`). The network is closed to everything but
loopback; the tests fail (never skip) without Chromium."""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.remote.webdriver import WebDriver

from tests.conftest import RedisServer
from tests.e2e.conftest import BrokerFactory, BrokerProcess, SimulatorProcess, until

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
LOOPBACK = ("127.0.0.1", "127.0.0.2")  #: the broker, and the "other site" of the cross-site test
FAST = {"RUNS_POLL_INTERVAL": "200", "RUNS_BACKOFF": "50", "RUNS_BACKOFF_MAX": "200"}


def sim_settings(simulator: SimulatorProcess, **changes: Any) -> None:
    """Change the simulator's settings (`/_sim/settings`), e.g. `step_s=0.3`."""
    request = urllib.request.Request(f"{simulator.url}/_sim/settings", data=json.dumps(changes).encode(), method="POST")
    with urllib.request.urlopen(request, timeout=5):
        pass


@pytest.fixture
def broker(clean_redis: RedisServer, simulator: SimulatorProcess, start_broker: BrokerFactory) -> BrokerProcess:
    """One broker replica driving jobs against the simulator, on a Redis without other tests' jobs."""
    return start_broker(redis_url=clean_redis.url, HERMES_URL=simulator.url, HERMES_TIMEOUT="5000", **FAST)


def _binaries() -> tuple[str, str]:
    chromium = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    driver = shutil.which("chromedriver") or (CHROMEDRIVER if Path(CHROMEDRIVER).exists() else None)
    if chromium is None or driver is None:
        pytest.fail("the browser tests need Debian's chromium and chromium-driver (apt-get install them)")
    return chromium, driver


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    chromium, driver_path = _binaries()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-default-apps",
        "--disable-extensions",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        # Every name resolves to nothing: only the loopback addresses used by the tests are reachable.
        f"--host-resolver-rules=MAP * ~NOTFOUND, {', '.join(f'EXCLUDE {ip}' for ip in LOOPBACK)}",
        "--proxy-server=http://127.0.0.1:9",  # and anything not on loopback goes to a closed port
        f"--proxy-bypass-list={';'.join(LOOPBACK)}",
    ):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
    service = Service(executable_path=driver_path, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def requested_urls(driver: WebDriver) -> list[str]:
    """Every URL the browser requested since the last call (from the performance log)."""
    urls = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message.get("method") == "Network.requestWillBeSent":
            urls.append(message["params"]["request"]["url"])
    return urls


def eventually(probe: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    return until(probe, timeout, what)
