"""e2e fixtures: broker processes (`python -m broker`) owned by a factory that cleans up, and a
Hermes that accepts connections but never answers (jobs stay queued, their objects stay still)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from io import BytesIO
from pathlib import Path
from typing import Any, cast

import pytest
import redis
from attrs import define

from broker.config import _VARIABLES
from tests.conftest import LocalCluster, RedisServer, free_port, wait_for_port

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0


class BrokerProcess:
    """One `python -m broker` on a free loopback port; its output goes to a log file."""

    def __init__(self, env: dict[str, str], log_path: Path, cwd: Path = ROOT, stderr_path: Path | None = None) -> None:
        self.env = env
        self.port = int(env["PORT"])
        self.log_path = log_path
        self.stderr_path = stderr_path  #: where stderr goes when it is kept apart from the log (stdout)
        self.cwd = cwd  #: the code it runs (another checkout: an older broker)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> BrokerProcess:
        with contextlib.ExitStack() as files:
            log = files.enter_context(self.log_path.open("ab"))
            errors = files.enter_context(self.stderr_path.open("ab")) if self.stderr_path else subprocess.STDOUT
            self.process = subprocess.Popen(
                [sys.executable, "-m", "broker"], env=self.env, cwd=self.cwd, stdout=log, stderr=errors
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the broker exited with {self.process.returncode}:\n{self.log_path.read_text()[-3000:]}")
            try:
                if self.request("GET", "/healthz", timeout=0.5)[0] == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.05)
        self.kill()
        pytest.fail(f"the broker did not answer /healthz in time:\n{self.log_path.read_text()[-3000:]}")

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 5.0, **headers: str
    ) -> tuple[int, Any]:
        status, answer, _ = self.exchange(method, path, body, timeout, **headers)
        return status, answer

    def exchange(
        self, method: str, path: str, body: Any = None, timeout: float = 5.0, **headers: str
    ) -> tuple[int, Any, dict[str, str]]:
        """The answer's status, JSON body and headers."""
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                return answer.status, json.loads(answer.read() or b"null"), dict(answer.headers)
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null"), dict(error.headers)

    def kill(self) -> None:
        """SIGKILL: no drain, no cleanup."""
        self._signal(signal.SIGKILL)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait for the drain to finish."""
        return self._signal(signal.SIGTERM, timeout)

    def _signal(self, signum: int, timeout: float = 10.0) -> int:
        if self.process is None:
            return 0
        process, self.process = self.process, None
        if process.poll() is None:
            process.send_signal(signum)
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            pytest.fail(f"the broker did not exit after signal {signum}")


BrokerFactory = Callable[..., BrokerProcess]


def older_broker(commit: str, target: Path) -> Path:
    """`broker/` and `projections/` of an earlier commit, extracted into `target`: an older replica to run beside
    this one (`start_broker(cwd=...)`) in the rolling-upgrade tests."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", commit, "broker", "projections"], cwd=ROOT, capture_output=True, check=False
    )
    if archive.returncode != 0:
        pytest.fail(f"cannot check out {commit} (needs the git history): {archive.stderr.decode()}")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(target, filter="data")
    return target


@pytest.fixture
def silent_hermes() -> Iterator[str]:
    """A Hermes URL that accepts connections and never answers: the driver waits, appends nothing."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(128)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture
def start_broker(tmp_path: Path, silent_hermes: str) -> Iterator[BrokerFactory]:
    """Start `python -m broker` with `REDIS_URL` (or embedded Redis under `data_dir`); stopped at teardown.

    `split_stderr`: stderr goes to its own file (`stderr_path`), apart from the log lines on stdout."""
    started: list[BrokerProcess] = []

    def start(
        *,
        redis_url: str | None,
        data_dir: Path | None = None,
        port: int | None = None,
        cwd: Path = ROOT,
        split_stderr: bool = False,
        **variables: str,
    ) -> BrokerProcess:
        env = {name: value for name, value in os.environ.items() if name not in _VARIABLES}
        env.update(
            HOST="127.0.0.1",
            PORT=str(port or free_port()),
            HERMES_URL=silent_hermes,
            HERMES_TIMEOUT="600000",
            SHUTDOWN_GRACE="3000",
            LOG_LEVEL="info",
            PYTHONUNBUFFERED="1",
        )
        if redis_url is not None:
            env["REDIS_URL"] = redis_url
        env["DATA_DIR"] = str(data_dir or tmp_path / "data")
        env.update(variables)
        log_path = tmp_path / f"broker-{len(started)}.log"
        broker = BrokerProcess(env, log_path, cwd, log_path.with_suffix(".stderr") if split_stderr else None)
        started.append(broker)
        return broker.start()

    yield start
    for broker in started:
        if broker.process is not None:
            broker.terminate()


class SimulatorProcess:
    """`python -m broker.simulator` in upstream-main mode (durable keys), uncapped unless `max_concurrent`."""

    def __init__(self, port: int, max_concurrent: int = 0, api_key: str | None = None) -> None:
        self.url = f"http://127.0.0.1:{port}"
        command = [sys.executable, "-m", "broker.simulator", "--port", str(port), "--upstream-main"]
        if api_key is not None:
            command += ["--api-key", api_key]  # it answers 401 to any other
        self.process = subprocess.Popen(
            [*command, "--max-concurrent", str(max_concurrent)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_port(port)

    def creates(self) -> list[str]:
        with urllib.request.urlopen(f"{self.url}/_sim/requests", timeout=5) as answer:
            requests = json.loads(answer.read())["requests"]
        return [r["idempotency_key"] for r in requests if r["method"] == "POST" and r["path"] == "/v1/runs"]


@pytest.fixture
def clean_redis(redis_server: RedisServer) -> RedisServer:
    """The session server without other tests' jobs (their brokers would drive them against our Hermes)."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushdb()
    client.close()
    return redis_server


@define
class Store:
    """Where brokers keep their jobs: the URL and the variables that go with it (REDIS_CLUSTER)."""

    url: str
    variables: dict[str, str]

    def client(self) -> redis.Redis:
        if self.variables.get("REDIS_CLUSTER") == "true":
            return cast(redis.Redis, redis.RedisCluster.from_url(self.url, decode_responses=True))
        return redis.Redis.from_url(self.url, decode_responses=True)


@pytest.fixture(params=["single", "cluster"])
def clean_store(request: pytest.FixtureRequest) -> Store:
    """A flushed single Redis (the session server) or the session cluster: the test runs on both."""
    if request.param == "cluster":
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        cluster.wait_ok()
        cluster.flush()
        return Store(cluster.url, {"REDIS_CLUSTER": "true"})
    server: RedisServer = request.getfixturevalue("clean_redis")
    return Store(server.url, {})


@pytest.fixture
def simulator() -> Iterator[SimulatorProcess]:
    sim = SimulatorProcess(free_port())
    yield sim
    sim.process.terminate()
    sim.process.wait(timeout=10)


def until(probe: Any, timeout: float, what: str = "condition") -> Any:
    """Poll `probe` until it returns something truthy; fail with its last value at the deadline."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(0.05)
    raise AssertionError(f"{what} not met within {timeout}s; last: {last!r}")
