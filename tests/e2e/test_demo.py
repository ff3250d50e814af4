"""`python -m broker.demo --once` (SPEC S7): the whole story in one command, console URL first, exit 0 when
every job ended as expected, well within a minute."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from broker.config import _VARIABLES
from tests.e2e.conftest import ROOT


def test_the_demo_plays_every_job_to_its_expected_end(tmp_path: Path) -> None:
    env = {name: value for name, value in os.environ.items() if name not in _VARIABLES}
    logs = tmp_path / "demo-logs"
    done = subprocess.run(
        [sys.executable, "-m", "broker.demo", "--once", "--logs", str(logs)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=55,
    )
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert lines[0].startswith("Console: http://127.0.0.1:") and "/console" in lines[0]
    # the logs it names are there after it exits (with --logs they are kept)
    assert f"logs under {logs}" in lines[0] and lines[-1] == f"The logs are kept under {logs}."
    assert {path.name for path in logs.glob("*.log")} >= {
        "replica-1.log",
        "replica-2.log",
        "simulator-1.log",
        "simulator-2.log",
    }
    results = [line for line in lines if "] result  " in line]
    assert len(results) == 5 and all(line.endswith("as expected") for line in results), results
    for story in ("held", "interrupted", "stop", "deny", "board   runs-job_"):
        assert any(story in line.lower() for line in lines), story
    assert any("state=approval_denied" in line for line in lines)
