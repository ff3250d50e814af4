"""Chaos smoke: 3 broker replicas, the Hermes simulator (upstream-main mode) and redis-server on loopback;
replicas and Hermes are killed and restarted at seeded random points while jobs run.

    python scripts/chaos_smoke.py [--seed 7] [--jobs 60] [--chaos-seconds 40]

Passes (exit 0) when every acknowledged job is still there and terminal, and Hermes started at most one
run per attempt key (`<job>`, `<job>#<n>`). Prints its figures as one JSON object. Bounded in time; only
loopback traffic.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from helpformat import HelpFormatter

ROOT = Path(__file__).resolve().parents[1]
TERMINAL = {"completed", "failed", "cancelled"}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def call(
    url: str, method: str = "GET", body: Any = None, timeout: float = 5.0, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json", **(headers or {})}
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def wait_until(probe: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if probe():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit(f"chaos: {what} not within {timeout}s")


class Replica:
    def __init__(self, index: int, env: dict[str, str], workdir: Path) -> None:
        self.index, self.env, self.port = index, env, free_port()
        self.log = workdir / f"broker-{index}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**self.env, "PORT": str(self.port)}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "broker"], env=env, cwd=ROOT, stdout=log, stderr=log)
        wait_until(lambda: call(f"{self.url}/healthz", timeout=0.5)[0] == 200, 20, f"replica {self.index} start")

    def stop(self, signum: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signum)
            self.process.wait(timeout=30)
        self.process = None


def start_services(workdir: Path) -> tuple[subprocess.Popen[bytes], str, subprocess.Popen[bytes], str]:
    redis_port, sim_port = free_port(), free_port()
    redis = subprocess.Popen(
        [shutil.which("redis-server") or "redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
         "--dir", str(workdir), "--save", "", "--appendonly", "yes"],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    sim = subprocess.Popen(
        [sys.executable, "-m", "broker.simulator", "--port", str(sim_port), "--upstream-main",
         "--max-concurrent", "12"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    sim_url = f"http://127.0.0.1:{sim_port}"
    wait_until(lambda: call(f"{sim_url}/health", timeout=0.5)[0] == 200, 20, "simulator start")
    return redis, f"redis://127.0.0.1:{redis_port}/0", sim, sim_url


def create_jobs(rng: random.Random, replicas: list[Replica], count: int) -> list[str]:
    jobs = []
    for n in range(count):
        text = rng.choice(["hello", "slow sleep:2", "sleep:1 tools:2", "tools:3", "fail", "sleep:3"])
        headers = {"Idempotency-Key": f"chaos-{n}"} if rng.random() < 0.5 else {}
        status, body = call(f"{rng.choice(replicas).url}/v1/runs", "POST", {"input": f"{text} #{n}"}, headers=headers)
        assert status == 202, (status, body)
        jobs.append(body["run_id"])
    return jobs


def chaos(rng: random.Random, replicas: list[Replica], sim_url: str, seconds: float) -> collections.Counter[str]:
    actions: collections.Counter[str] = collections.Counter()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(rng.uniform(0.5, 2.5))
        action = rng.choice(["kill", "term", "hermes-restart", "hermes-cancel", "busy"])
        actions[action] += 1
        if action in ("kill", "term"):
            replica = rng.choice(replicas)
            replica.stop(signal.SIGKILL if action == "kill" else signal.SIGTERM)
            time.sleep(rng.uniform(0, 1.5))
            replica.start()
        elif action.startswith("hermes"):
            call(f"{sim_url}/_sim/restart", "POST", {"cancel": action == "hermes-cancel", "down_s": rng.uniform(0, 1)})
        else:
            call(f"{sim_url}/_sim/settings", "POST", {"busy": True})
            time.sleep(rng.uniform(0.2, 1.5))
            call(f"{sim_url}/_sim/settings", "POST", {"busy": False})
    return actions


def verify(replicas: list[Replica], sim_url: str, jobs: list[str], timeout: float) -> dict[str, Any]:
    url = replicas[0].url

    def all_terminal() -> bool:
        return all(call(f"{url}/v1/runs/{job}")[1].get("status") in TERMINAL for job in jobs)

    wait_until(all_terminal, timeout, "every job terminal")
    finished = [call(f"{url}/v1/runs/{job}")[1] for job in jobs]
    lost = [job for job, body in zip(jobs, finished, strict=True) if body.get("run_id") != job]
    requests = call(f"{sim_url}/_sim/requests")[1]["requests"]
    runs_per_key: dict[str, set[str]] = collections.defaultdict(set)
    for entry in requests:
        if entry.get("run_id") and entry.get("idempotency_key"):
            runs_per_key[entry["idempotency_key"]].add(entry["run_id"])
    duplicated = {key: sorted(runs) for key, runs in runs_per_key.items() if len(runs) > 1}
    logs = "".join(replica.log.read_text() for replica in replicas)
    return {
        "jobs": len(jobs),
        "lost": lost,
        "statuses": dict(collections.Counter(body.get("status") for body in finished)),
        "errors": dict(collections.Counter((body.get("error") or {}).get("code") for body in finished)),
        "attempts": dict(collections.Counter(body.get("attempts") for body in finished)),
        "hermes_runs": sum(len(runs) for runs in runs_per_key.values()),
        "keys_with_two_runs": duplicated,
        "takeovers": logs.count("Took over a job."),
        "handed_back": logs.count("Handed jobs back on shutdown."),
        "resubmits": logs.count("Resubmitted a job."),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--seed", type=int, default=7, help="seed of the jobs and the chaos they meet")
    parser.add_argument("--jobs", type=int, default=60, help="jobs created before the chaos")
    parser.add_argument("--chaos-seconds", type=float, default=40.0, help="how long replicas and Hermes are disrupted")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    workdir = Path(tempfile.mkdtemp(prefix="hbr-chaos-"))
    redis, redis_url, sim, sim_url = start_services(workdir)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RUNS_", "BOARD_", "HERMES_"))},
        "REDIS_URL": redis_url, "HERMES_URL": sim_url, "HOST": "127.0.0.1", "RUNS_LEASE": "2000",
        "RUNS_POLL_INTERVAL": "300", "RUNS_BACKOFF": "100", "RUNS_BACKOFF_MAX": "1000", "SHUTDOWN_GRACE": "5000",
    }  # fmt: skip
    replicas = [Replica(i, env, workdir) for i in range(3)]
    started = time.monotonic()
    try:
        for replica in replicas:
            replica.start()
        jobs = create_jobs(rng, replicas, args.jobs)
        actions = chaos(rng, replicas, sim_url, args.chaos_seconds)
        report = verify(replicas, sim_url, jobs, timeout=180)
    finally:
        for replica in replicas:
            replica.stop(signal.SIGTERM)
        for process in (sim, redis):
            process.terminate()
            process.wait(timeout=10)
    report.update(seed=args.seed, chaos=dict(actions), seconds=round(time.monotonic() - started, 1), logs=str(workdir))
    print(json.dumps(report, indent=1))
    return 1 if report["lost"] or report["keys_with_two_runs"] else 0


if __name__ == "__main__":
    sys.exit(main())
