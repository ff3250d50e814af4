"""Backup and restore as docs/operations/backup.md prints it: its shell blocks run here exactly as written.

A broker writes jobs into a Redis 7 with AOF (some completed, some held while Hermes is busy); the "Back up" block
copies the AOF directory while the broker runs; the "Restore the files" block puts the copy into a fresh Redis's
directory; the "Rebuild" block rebuilds the projections there; a broker on the restored Redis answers every job
over HTTP as it was.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from tests.conftest import RedisServer, redis_7
from tests.e2e.conftest import ROOT, BrokerFactory, SimulatorProcess, until

GUIDE = ROOT / "docs" / "operations" / "backup.md"


def guide_block(title: str) -> str:
    """The shell block of the guide with this title (```sh title="…")."""
    found = re.search(rf'```sh title="{re.escape(title)}"\n(.*?)```', GUIDE.read_text(), re.DOTALL)
    assert found, f"docs/operations/backup.md has no block titled {title!r}"
    return found.group(1)


def run_block(title: str, tmp_path: Path, **variables: str) -> None:
    """Run one block of the guide with bash -e, with redis-cli >= 7 and `python` (this interpreter) on PATH."""
    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    for name, target in (("python", sys.executable), ("redis-cli", redis_7("redis-cli"))):
        link = tools / name
        if not link.exists():
            link.symlink_to(target)
    env = {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), **variables}
    env.pop("DATA_DIR", None)
    done = subprocess.run(
        ["bash", "-e", "-c", guide_block(title)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{title}: exit {done.returncode}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


def jobs_of(broker: Any) -> dict[str, dict[str, Any]]:
    status, page = broker.request("GET", "/v1/runs?limit=200")
    assert status == 200
    return {job["run_id"]: job for job in page["data"]}


def test_a_backup_of_the_aof_restores_into_a_fresh_redis_with_every_job(
    tmp_path: Path, start_broker: BrokerFactory, simulator: SimulatorProcess
) -> None:
    # Given a broker on a Redis 7 with AOF, with completed jobs and jobs held while Hermes is busy
    source = RedisServer(tmp_path / "source", binary=redis_7())
    source.directory.mkdir()
    source.start()
    restored = RedisServer(tmp_path / "restored", binary=redis_7())
    try:
        broker = start_broker(redis_url=source.url, HERMES_URL=simulator.url)
        completed = [broker.request("POST", "/v1/runs", {"input": f"hello {n}"})[1]["run_id"] for n in range(5)]
        until(lambda: all(broker.request("GET", f"/v1/runs/{j}")[1]["status"] == "completed" for j in completed), 30)
        busy = urllib.request.Request(
            f"{simulator.url}/_sim/settings", data=json.dumps({"busy": True}).encode(), method="POST"
        )
        urllib.request.urlopen(busy, timeout=5).close()
        held = [broker.request("POST", "/v1/runs", {"input": f"later {n}"})[1]["run_id"] for n in range(3)]
        until(lambda: all(broker.request("GET", f"/v1/runs/{j}")[1]["hold"] for j in held), 30, "the jobs held")

        # When the guide's backup runs while the broker runs
        backup = tmp_path / "backup"
        backup.mkdir()
        run_block("Back up", tmp_path, REDIS_URL=source.url, SERVER_DIR=str(source.directory), BACKUP=str(backup))
        before = jobs_of(broker)
        broker.terminate()
        source.stop()

        # ... and the guide's restore into a fresh Redis, then its rebuild
        restored.directory.mkdir()
        run_block("Restore the files", tmp_path, BACKUP=str(backup), NEW_SERVER_DIR=str(restored.directory))
        restored.start()
        run_block("Rebuild", tmp_path, NEW_REDIS_URL=restored.url)

        # Then a broker on the restored Redis answers every job over HTTP as it was
        again = start_broker(redis_url=restored.url)
        after = jobs_of(again)
        assert set(after) == set(before) == {*completed, *held}
        for job_id in completed:
            status, job = again.request("GET", f"/v1/runs/{job_id}")
            assert status == 200
            assert job == before[job_id]
            assert job["output"]
        for job_id in held:
            status, job = again.request("GET", f"/v1/runs/{job_id}")
            assert status == 200
            assert (job["status"], job["attempts"], job["created_at"]) == ("queued", 0, before[job_id]["created_at"])
    finally:
        source.stop()
        restored.stop()
