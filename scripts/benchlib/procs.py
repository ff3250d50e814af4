"""Processes the benchmark starts (redis-server, the simulator, broker replicas, baselines) and always stops.

Every process gets its own session (a Ctrl-C reaches only the benchmark, which then stops them in order) and a
log file in the run's work directory. `Stack.close()` runs on normal exit, on an exception, on Ctrl-C and on
SIGTERM (turned into SystemExit by `bench.py`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import aiohttp
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from broker.store.embedded import free_port

ROOT = Path(__file__).resolve().parents[2]
BASELINES = ROOT / "scripts" / "bench_baselines"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
#: Variables the children never inherit (OTEL_: the tracing row decides where brokers export to).
BROKER_VARIABLES = ("RUNS_", "BOARD_", "HERMES_", "REDIS_", "LOG_", "SHUTDOWN_", "CONSOLE_", "DATA_DIR", "PORT", "HOST",
                    "OTEL_")  # fmt: skip


class Proc:
    """One child process with its log; `stop()` is idempotent."""

    def __init__(self, name: str, argv: Sequence[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        self.url = ""  #: the HTTP base URL, for servers
        with log.open("ab") as out:
            self.popen = subprocess.Popen(
                list(argv), env=env, cwd=ROOT, stdout=out, stderr=out, stdin=subprocess.DEVNULL, start_new_session=True
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace_s: float = 5.0) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)

    async def output(self, timeout_s: float) -> str:
        """The last line the process printed, once it exited 0 (within the timeout)."""
        deadline = time.monotonic() + timeout_s
        while self.alive():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} still running after {timeout_s:g} s: see {self.log}")
            await asyncio.sleep(0.05)
        if self.popen.returncode != 0:
            raise RuntimeError(f"{self.name} exited {self.popen.returncode}: see {self.log}")
        return self.log.read_text().strip().splitlines()[-1]

    def rss_mb(self) -> float:
        """Resident set size from /proc/<pid>/status."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        raise RuntimeError(f"{self.name}: no VmRSS")

    def cpu_s(self) -> float:
        """utime + stime from /proc/<pid>/stat, in seconds."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


class Stack:
    """Owns the run's work directory and every process started in it."""

    def __init__(self) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="hbr-bench-"))
        self._procs: list[Proc] = []
        self._counter = 0
        atexit.register(self.stop_all)  # a last resort: no child outlives the benchmark

    def spawn(self, name: str, argv: Sequence[str], env: dict[str, str] | None = None) -> Proc:
        self._counter += 1
        log = self.workdir / f"{self._counter:03d}-{name}.log"
        inherited = {key: value for key, value in os.environ.items() if not key.startswith(BROKER_VARIABLES)}
        proc = Proc(name, argv, {**inherited, **(env or {})}, log)
        self._procs.append(proc)
        return proc

    def stop(self, proc: Proc) -> None:
        proc.stop()
        if proc in self._procs:
            self._procs.remove(proc)

    def stop_all(self) -> None:
        for proc in reversed(self._procs):
            with contextlib.suppress(Exception):
                proc.stop(grace_s=3.0)
        self._procs.clear()

    def close(self, keep_logs: bool = False) -> None:
        self.stop_all()
        if not keep_logs:
            shutil.rmtree(self.workdir, ignore_errors=True)


def broker_env(redis_url: str, hermes_url: str, port: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The broker's configuration: only what the benchmark sets (children inherit none of BROKER_VARIABLES)."""
    return {"REDIS_URL": redis_url, "HERMES_URL": hermes_url, "HOST": "127.0.0.1", "PORT": str(port),
            "LOG_LEVEL": "warn", "SHUTDOWN_GRACE": "3000", **(extra or {})}  # fmt: skip


async def wait_http(url: str, timeout_s: float, what: str, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            if proc is not None and not proc.alive():
                raise RuntimeError(f"{what} exited: see {proc.log}")
            with contextlib.suppress(aiohttp.ClientError, OSError, asyncio.TimeoutError):
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as answer:
                    if answer.status == 200:
                        return
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{what} not up within {timeout_s}s")


def redis_major(binary: str) -> int:
    """The major version of a redis-server binary (0 when it does not say)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"v=(\d+)\.", out)
    return int(found.group(1)) if found else 0


async def spawn_redis(stack: Stack, name: str, binary: str, port: int, *extra: str,
                      directory: Path | None = None) -> tuple[Proc, Redis, str]:  # fmt: skip
    """A redis-server on loopback without persistence, answering PING: (process, client, URL)."""
    workdir = directory or stack.workdir
    proc = stack.spawn(name, [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
                              "--save", "", "--appendonly", "no", *extra])  # fmt: skip
    url = f"redis://127.0.0.1:{port}/0"
    client = Redis.from_url(url, decode_responses=True)
    deadline = time.monotonic() + 10
    while True:
        try:
            await client.ping()
            return proc, client, url
        except (OSError, RedisConnectionError):
            if time.monotonic() > deadline or not proc.alive():
                await client.aclose()
                raise RuntimeError(f"{name} did not answer PING: see {proc.log}") from None
            await asyncio.sleep(0.05)


class Services:
    """One redis-server and one simulator for the whole run; brokers and baselines per scenario."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.redis_url = ""
        self.sim_url = ""
        self.redis: Redis | None = None

    async def start(self) -> None:
        server = shutil.which("redis-server") or "redis-server"
        # Redis 7 keeps a latency histogram of ~27 KB per command name it has run (latency-tracking); the memory row
        # would charge those made after its baseline to the jobs it measures, so the benchmark's server keeps none
        extra = ("--latency-tracking", "no") if redis_major(server) >= 7 else ()
        self.redis_proc, self.redis, self.redis_url = await spawn_redis(self.stack, "redis", server, free_port(),
                                                                        "--maxclients", "18000", *extra)  # fmt: skip
        sim_port = free_port()
        self.sim_proc = self.stack.spawn(
            "simulator", [sys.executable, "-m", "broker.simulator", "--port", str(sim_port), "--max-concurrent", "0"]
        )
        self.sim_url = f"http://127.0.0.1:{sim_port}"
        await wait_http(f"{self.sim_url}/health", 20, "simulator", self.sim_proc)

    @property
    def r(self) -> Redis:
        assert self.redis is not None
        return self.redis

    async def reset(self, **settings: object) -> None:
        """Empty Redis, forget the simulator's runs and counters, then apply simulator settings."""
        await self.r.flushall()
        await self.r.config_resetstat()
        await self.reset_sim(**settings)

    async def reset_sim(self, **settings: object) -> None:
        """Forget the simulator's runs and counters, then apply simulator settings (Redis left as it is)."""
        async with aiohttp.ClientSession(self.sim_url) as session:
            for method, path, body in (("POST", "/_sim/restart", {}), ("DELETE", "/_sim/requests", None),
                                       ("DELETE", "/_sim/stats", None)):  # fmt: skip
                async with session.request(method, path, json=body) as answer:
                    answer.raise_for_status()
        await self.sim_settings(**{"step_s": 0.05, "max_concurrent": 0, "busy": False, **settings})

    async def sim_settings(self, **settings: object) -> None:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{self.sim_url}/_sim/settings", json=settings) as answer:
                answer.raise_for_status()

    async def sim_stats(self, session: aiohttp.ClientSession) -> dict[str, object]:
        async with session.get(f"{self.sim_url}/_sim/stats") as answer:
            stats: dict[str, object] = await answer.json()
            return stats

    @contextlib.asynccontextmanager
    async def brokers(self, count: int, extra: dict[str, str] | None = None) -> AsyncIterator[list[Proc]]:
        """`count` broker replicas, serving (GET /healthz 200: Redis is connected by then) before the body runs."""
        procs: list[Proc] = []
        try:
            for _ in range(count):
                port = free_port()
                env = broker_env(self.redis_url, self.sim_url, port, extra)
                proc = self.stack.spawn("broker", [sys.executable, "-m", "broker"], env)
                proc.url = f"http://127.0.0.1:{port}"
                procs.append(proc)
            for proc in procs:
                await wait_http(f"{proc.url}/healthz", 30, "broker", proc)
            yield procs
        finally:
            for proc in procs:
                proc.popen.send_signal(signal.SIGTERM)
            for proc in procs:
                self.stack.stop(proc)

    @contextlib.asynccontextmanager
    async def baseline(self, script: str, env: dict[str, str] | None = None, health: str | None = None,
                       python: str = sys.executable) -> AsyncIterator[Proc]:  # fmt: skip
        """A baseline from scripts/bench_baselines/ in its own process (BENCH_REDIS_URL, BENCH_HERMES_URL set)."""
        base_env = {"BENCH_REDIS_URL": self.redis_url, "BENCH_HERMES_URL": self.sim_url, **(env or {})}
        proc = self.stack.spawn(script, [python, str(BASELINES / script)], base_env)
        try:
            if health is not None:
                await wait_http(health, 20, script, proc)
            yield proc
        finally:
            self.stack.stop(proc)

    async def close(self) -> None:
        if self.redis is not None:
            await self.redis.aclose()
