"""Startup failures a new user meets (issue 9 §4): one line naming the problem, no traceback, nothing left running."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker.config import _VARIABLES
from tests.e2e.conftest import ROOT


def _redis_servers_of(data_dir: Path) -> list[int]:
    """Pids of redis-server processes working in `data_dir` (Linux /proc).

    redis-server rewrites its command line ("redis-server 127.0.0.1:port") but runs in its `--dir`.
    """
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
            cwd = (entry / "cwd").resolve(strict=True)
        except OSError:
            continue  # exited meanwhile, or not ours to read
        if name.startswith("redis-server") and cwd == data_dir.resolve():
            found.append(int(entry.name))
    return found


def _is_log_line(line: str) -> bool:
    try:
        record = json.loads(line)
    except ValueError:
        return False
    return isinstance(record, dict) and "level" in record and "message" in record


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads processes from /proc")
def test_a_port_in_use_prints_one_line_and_stops_the_embedded_redis(tmp_path: Path) -> None:
    # Given a port something else listens on, and a broker configured with embedded Redis
    data_dir = tmp_path / "data"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env = {name: value for name, value in os.environ.items() if name not in _VARIABLES}
        env.update(HOST="127.0.0.1", PORT=str(port), DATA_DIR=str(data_dir), LOG_LEVEL="info", PYTHONUNBUFFERED="1")
        # When the broker starts
        done = subprocess.run(
            [sys.executable, "-m", "broker"], env=env, cwd=ROOT, capture_output=True, timeout=60, check=False
        )
    output = (done.stdout + done.stderr).decode()
    # Then it exits non-zero with that one line, no traceback, and only ordinary log lines besides
    assert done.returncode == 1, output
    assert "Traceback" not in output
    assert [line for line in output.splitlines() if not _is_log_line(line)] == [
        f"PORT {port} is already in use on 127.0.0.1"
    ]
    levels = {json.loads(line)["level"] for line in output.splitlines() if _is_log_line(line)}
    assert levels <= {"debug", "info"}, output
    assert "Started the embedded Redis." in output and "Stopped the embedded Redis." in output  # unwound, not killed
    # And no redis-server of that data dir survives it
    deadline = time.monotonic() + 10
    while (left := _redis_servers_of(data_dir)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert left == []
