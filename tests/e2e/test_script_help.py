"""The tools' `--help` (SPEC S7): every option of the simulator and of each script in `scripts/` that takes a
value says what it defaults to."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.e2e.conftest import ROOT

SCRIPTS = sorted(path.name for path in (ROOT / "scripts").glob("*.py") if "ArgumentParser(" in path.read_text())
SECTIONS = ("options:", "positional arguments:")


def _entries(text: str) -> list[tuple[str, str]]:
    """(invocation, help) of each argument in argparse's layout: `--seed SEED`, `a seed (default: 7)`."""
    entries: list[list[str]] = []
    within = False
    for line in text.splitlines():
        if line and not line.startswith(" "):
            within = line in SECTIONS
        elif within and line.strip():
            if line.startswith("  ") and not line.startswith("   "):
                invocation, _, rest = line.strip().partition("  ")
                entries.append([invocation, rest.strip()])
            else:
                entries[-1][1] += " " + line.strip()
    return [(invocation, help_text) for invocation, help_text in entries]


def _takes_a_value(invocation: str) -> bool:
    words = invocation.replace(",", " ").split()
    return any(not word.startswith("-") for word in words)  # a metavar, a choice list, or a positional


def _help(*command: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, *command, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", [["-m", "broker.simulator"]] + [[f"scripts/{name}"] for name in SCRIPTS], ids=str)
def test_every_option_that_takes_a_value_shows_its_default(command: list[str]) -> None:
    entries = _entries(_help(*command))
    assert ("-h, --help", "show this help message and exit") in entries  # the layout was read
    valued = [(invocation, text) for invocation, text in entries if _takes_a_value(invocation)]
    assert [invocation for invocation, text in valued if "default" not in text] == []
