"""What an operator meets first (SPEC S7): `python -m broker --help`/`--version` without starting anything, and
a usage error for anything else."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from broker.config import _VARIABLES
from tests.e2e.conftest import ROOT


def _broker(*args: str, **variables: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if name not in _VARIABLES}
    env.update(variables)
    return subprocess.run(
        [sys.executable, "-m", "broker", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )


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
