"""What an operator meets first (SPEC S7): `python -m broker --help`/`--version` without starting anything, a
usage error for anything else, and at startup one line of the effective configuration (never a secret) and a
warn line naming each unknown variable with one of the broker's prefixes."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from broker.config import _VARIABLES
from tests.conftest import RedisServer
from tests.e2e.conftest import ROOT, BrokerFactory

API_KEY = "hermes-key-6be1f0"
BOARD_PASSWORD = "board-pass-0c93aa"
SIGNING = "whsec_" + base64.b64encode(b"signing-key-for-the-test-0123456").decode()
TYPO_VALUE = "typo-value-3d7e"


def _broker(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name not in _VARIABLES}
    env.update(variables)
    return subprocess.run(
        [sys.executable, "-m", "broker", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


def _records(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def test_help_prints_every_variable_with_its_default_and_starts_nothing(tmp_path: Path) -> None:
    # Given an environment the broker could not even start with (and a data dir it would create)
    data_dir = tmp_path / "data"
    # When an operator asks for help
    done = _broker("--help", PORT="not-a-port", DATA_DIR=str(data_dir))
    # Then it exits 0 with every variable, its default and meaning, and nothing started or logged
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.startswith("usage: python -m broker")
    rows = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("  ") and line.split()}
    for name in _VARIABLES:
        assert name in rows, name
    assert rows["RUNS_RETENTION"].split()[1:3] == ["604800000", "ms"]
    assert rows["HERMES_URL"].split()[1] == "http://127.0.0.1:8642"
    assert '"level"' not in done.stdout and not data_dir.exists()


def test_version_prints_the_package_version() -> None:
    done = _broker("--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"hermes-bridge-runs {metadata.version('hermes-bridge-runs')}")


def test_an_unknown_argument_is_a_usage_error(tmp_path: Path) -> None:
    done = _broker("--verbose", DATA_DIR=str(tmp_path / "data"))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "usage: python -m broker [-h] [--version]",
        "python -m broker: error: unrecognized arguments: --verbose",
    ]
    assert not (tmp_path / "data").exists()


def test_startup_logs_the_effective_configuration_without_a_secret_and_names_unknown_variables(
    start_broker: BrokerFactory, clean_redis: RedisServer, silent_hermes: str
) -> None:
    # Given secrets in the environment: an API key, a board URL with a password, a signing secret; a known
    # variable set and two unknown ones with the broker's prefixes, one of them carrying a value
    board = f"http://receiver:{BOARD_PASSWORD}@127.0.0.1:9/reports"
    # When the broker starts and stops
    broker = start_broker(
        redis_url=clean_redis.url,
        HERMES_API_KEY=API_KEY,
        BOARD_ENABLED="true",
        BOARD_URL=board,
        BOARD_SIGNING_SECRET=SIGNING,
        RUNS_HOLD="60000",
        RUNS_TYPO="1",
        HERMES_APIKEY=TYPO_VALUE,
        OTEL_SDK_DISABLED="true",
    )
    assert broker.terminate() == 0
    records = _records(broker.log_path)

    # Then one info line holds the effective configuration as root fields
    [line] = [r for r in records if r["message"] == "Read the configuration."]
    redis_node = clean_redis.url.removeprefix("redis://").split("/")[0]
    expected = {
        "level": "info",
        "context": "broker.config.Configuration",
        "upstreams": silent_hermes.removeprefix("http://"),
        "redis": "single",
        "redisNode": redis_node,
        "board": True,
        "boardHost": "127.0.0.1:9",
        "signing": True,
        "tracing": False,
        "retentionMs": 604_800_000,
        "deltaRetentionMs": 3_600_000,
        "fairnessDefault": "session_key",
    }
    assert {key: line.get(key) for key in expected} == expected
    # and a warn line names each unknown variable, never its value, and none for a known one
    unknown = [r for r in records if r["message"] == "Ignored an unknown variable."]
    assert sorted((r["level"], r["variable"]) for r in unknown) == [("warn", "HERMES_APIKEY"), ("warn", "RUNS_TYPO")]
    # and no secret appears anywhere in the log
    log = broker.log_path.read_text()
    for secret in (API_KEY, BOARD_PASSWORD, SIGNING, SIGNING.removeprefix("whsec_"), TYPO_VALUE):
        assert secret not in log
