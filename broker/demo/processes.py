"""The demo's cast: the embedded Redis, the Hermes simulator and two broker replicas as child processes,
and a board receiver in this process that prints every report it receives."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import orjson
from aiohttp import web

from broker.config import _VARIABLES

Say = Callable[[str], None]
START_TIMEOUT_S = 30.0
FAST = {
    "RUNS_POLL_INTERVAL": "300",
    "RUNS_BACKOFF": "200",
    "RUNS_BACKOFF_MAX": "1000",
    "RUNS_LEASE": "3000",
    "SHUTDOWN_GRACE": "3000",
    "HERMES_TIMEOUT": "5000",
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Child:
    """One child process (`python -m <module>`) with its output in a log file."""

    def __init__(self, name: str, module: str, args: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", module, *args], env=env, stdout=log, stderr=subprocess.STDOUT
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


async def wait_until_up(session: aiohttp.ClientSession, child: Child, url: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if child.process.poll() is not None:
            raise RuntimeError(f"{child.name} exited at startup; see {child.log_path}")
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)) as answer:
                if answer.status < 500:
                    return
        except (aiohttp.ClientError, TimeoutError):
            pass
        await asyncio.sleep(0.1)
    raise RuntimeError(f"{child.name} did not start in time; see {child.log_path}")


def simulator(port: int, log_dir: Path, name: str = "simulator") -> Child:
    return Child(name, "broker.simulator", ["--port", str(port)], dict(os.environ), log_dir)


def broker(name: str, port: int, redis_url: str, hermes_url: str, board_url: str, log_dir: Path) -> Child:
    env = {key: value for key, value in os.environ.items() if key not in _VARIABLES}
    env.update(FAST)
    env.update(
        HOST="127.0.0.1",
        PORT=str(port),
        REDIS_URL=redis_url,
        HERMES_URL=hermes_url,
        BOARD_ENABLED="true",
        BOARD_URL=board_url,
        BOARD_PLATFORM="demo",
        LOG_LEVEL="warn",
        PYTHONUNBUFFERED="1",
    )
    return Child(name, "broker", [], env, log_dir)


def receiver(say: Say) -> web.Application:
    """A board receiver that prints what it receives and acknowledges it."""

    async def receive(request: web.Request) -> web.Response:
        try:
            report = orjson.loads(await request.read())
        except orjson.JSONDecodeError:
            return web.json_response({"error": "not JSON"}, status=400)
        error = f"  error={report['error']!r}" if report.get("error") else ""
        say(f"board   {report.get('key')}  state={report.get('state')}  title={report.get('title')!r}{error}")
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/board", receive)
    return app
