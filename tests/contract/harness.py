"""Processes the contract suite runs against: the simulator, and a real hermes-agent 0.19.0 with a stub LLM.

The real Hermes lives in its own virtualenv under `${HBR_CACHE_DIR:-~/.cache/hermes-bridge-runs}/hermes-venv`,
installed on first use and reused afterwards.
"""

from __future__ import annotations

import json
import os
import secrets
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

HERMES_REQUIREMENT = "hermes-agent==0.19.0"
MAX_CONCURRENT = 2  # both targets use a small cap so the busy case is cheap to reach
STUB_LLM = Path(__file__).with_name("stub_llm.py")
REPO_ROOT = Path(__file__).resolve().parents[2]


class HarnessError(Exception):
    """Raised when a target cannot be installed or started."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def new_api_key() -> str:
    return secrets.token_hex(16)  # 32 chars: Hermes refuses keys shorter than 16 or placeholder-looking


def wait_healthy(url: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise HarnessError(f"{url} exited with {process.returncode} before it was healthy:\n{_tail(log)}")
        try:
            with urllib.request.urlopen(url, timeout=1) as answer:
                if answer.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise HarnessError(f"{url} was not healthy after {timeout_s:.0f} s:\n{_tail(log)}")


def stop_process(process: subprocess.Popen[bytes] | None, grace_s: float = 30) -> None:
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _tail(log: Path, lines: int = 30) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Target:
    """What a contract test needs to know about the server under test."""

    name: str
    base_url: str
    api_key: str

    def restart(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SimTarget(Target):
    """`python -m broker.simulator` as a subprocess, controlled through `/_sim/`."""

    name = "sim"

    def __init__(self, workdir: Path) -> None:
        self.api_key = new_api_key()
        port = free_port()
        self.base_url = f"http://127.0.0.1:{port}"
        self._log = workdir / "simulator.log"
        command = [sys.executable, "-m", "broker.simulator", "--port", str(port), "--api-key", self.api_key]
        command += ["--max-concurrent", str(MAX_CONCURRENT)]
        with self._log.open("wb") as log:
            self._process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        wait_healthy(f"{self.base_url}/health", self._process, self._log, timeout_s=20)

    def control(self, path: str, body: dict[str, object]) -> dict[str, object]:
        request = urllib.request.Request(f"{self.base_url}/_sim/{path}", data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=10) as answer:
            return dict(json.load(answer))

    def restart(self) -> None:
        self.control("restart", {"cancel": True})  # as SIGTERM with no drain window

    def close(self) -> None:
        stop_process(self._process)


class RealTarget(Target):
    """`hermes gateway run` from its own virtualenv, with `stub_llm.py` as its model provider."""

    name = "real"

    def __init__(self, workdir: Path) -> None:
        self.api_key = new_api_key()
        self._port = free_port()
        self.base_url = f"http://127.0.0.1:{self._port}"
        self._workdir = workdir
        self._hermes_bin = ensure_hermes_venv() / "bin" / "hermes"
        self._home = workdir / "hermes-home"
        self.scratch = workdir / "scratch"
        self.scratch.mkdir()
        llm_port = free_port()
        stub_log = workdir / "stub-llm.log"
        self.llm_calls_path = workdir / "llm-calls.jsonl"  #: every agent call the stub LLM answered (stub_llm.py)
        with stub_log.open("wb") as log:
            self._stub = subprocess.Popen(
                [sys.executable, str(STUB_LLM), str(llm_port), str(self.scratch), str(self.llm_calls_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        self._hermes: subprocess.Popen[bytes] | None = None
        try:
            wait_healthy(f"http://127.0.0.1:{llm_port}/v1/models", self._stub, stub_log, timeout_s=20)
            self._write_home(llm_port)
            self._start()
        except BaseException:
            self.close()
            raise

    def _write_home(self, llm_port: int) -> None:
        self._home.mkdir()
        # Keys found by experiment with 0.19.0: `model` with provider `custom` points at the stub;
        # `gateway.api_server.max_concurrent_runs` sets the 429 cap; approvals `manual` always prompts
        # (the default `smart` asks an auxiliary LLM first).
        config = f"""\
model:
  provider: custom
  default: stub-model
  base_url: http://127.0.0.1:{llm_port}/v1
  api_key: stub-llm-key
gateway:
  api_server:
    max_concurrent_runs: {MAX_CONCURRENT}
approvals:
  mode: manual
  timeout: 60
agent:
  restart_drain_timeout: 0
"""
        (self._home / "config.yaml").write_text(config)

    def _start(self) -> None:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("API_SERVER_", "HERMES_"))}
        env.update(
            HERMES_HOME=str(self._home),
            API_SERVER_ENABLED="true",
            API_SERVER_KEY=self.api_key,
            API_SERVER_HOST="127.0.0.1",
            API_SERVER_PORT=str(self._port),
        )
        log_path = self._workdir / "hermes.log"
        with log_path.open("ab") as log:
            self._hermes = subprocess.Popen(
                [str(self._hermes_bin), "gateway", "run"],
                env=env,
                cwd=self._workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        wait_healthy(f"{self.base_url}/health", self._hermes, log_path, timeout_s=90)

    def restart(self) -> None:
        stop_process(self._hermes)
        self._start()

    def close(self) -> None:
        stop_process(self._hermes)
        stop_process(self._stub)


def cache_dir() -> Path:
    configured = os.environ.get("HBR_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "hermes-bridge-runs"


def ensure_hermes_venv() -> Path:
    """The virtualenv holding hermes-agent 0.19.0 (+ aiohttp for its API server), installed if missing."""
    venv = cache_dir() / "hermes-venv"
    marker = venv / ".hbr-installed"
    if marker.is_file() and marker.read_text() == HERMES_REQUIREMENT and (venv / "bin" / "hermes").exists():
        return venv
    shutil.rmtree(venv, ignore_errors=True)  # a half-finished install is not worth repairing
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [
        [sys.executable, "-m", "venv", str(venv)],
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", HERMES_REQUIREMENT, "aiohttp"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            raise HarnessError(f"{' '.join(step[:3])} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    marker.write_text(HERMES_REQUIREMENT)
    return venv


def start_target(name: str) -> tuple[Target, tempfile.TemporaryDirectory[str]]:
    workdir = tempfile.TemporaryDirectory(prefix=f"hbr-contract-{name}-")
    try:
        target: Target = SimTarget(Path(workdir.name)) if name == "sim" else RealTarget(Path(workdir.name))
    except BaseException:
        workdir.cleanup()
        raise
    return target, workdir
