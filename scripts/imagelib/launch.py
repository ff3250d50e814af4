"""Runs the built image: as containers (host network, a named volume on /data) where the machine allows, else
its exported root under chroot with the image's user, workdir, environment and command."""

from __future__ import annotations

import json
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Protocol

from imagelib.common import CheckFailed
from imagelib.engine import Engine, ImageConfig

CHROOT_EXEC = Path(__file__).with_name("chroot_exec.py")


class Proc(Protocol):
    name: str

    def terminate(self) -> None: ...

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None when it still runs after `timeout` seconds."""

    def logs(self) -> str: ...

    def exit_code(self) -> int | None:
        """The exit code once it ended, else None (no waiting)."""

    def uid(self) -> int | None:
        """The uid it runs as, seen from the host (None when it cannot be seen)."""


class Launcher(Protocol):
    description: str

    def start(self, name: str, command: list[str] | None, env: dict[str, str]) -> Proc:
        """Starts the image's command (or `command`) with `env` added; every start shares one /data."""

    def close(self) -> None: ...


def run_option_sets(engine: Engine) -> list[list[str]]:
    """`run` options to try, plainest first. Some sandboxes refuse raising rlimits to podman's root defaults
    (`setrlimit ... Operation not permitted`) and crun refuses hybrid cgroup hosts: the last set asks runc
    for limits no higher than this process has."""
    sets: list[list[str]] = [[]]
    if engine.program == "podman" and shutil.which("runc"):
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        nproc = min(4096, resource.getrlimit(resource.RLIMIT_NPROC)[0])
        limits = ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]
        sets.append(["--runtime", "runc", *limits])
    return sets


def choose_launcher(engine: Engine, image: str, config: ImageConfig, mode: str, scratch: Path) -> Launcher:
    """`mode`: `auto` (a container if one runs here, else chroot), `container` or `chroot`."""
    prefix = f"hbr-image-check-{os.getpid()}"
    if mode in ("auto", "container"):
        for options in run_option_sets(engine):
            if engine.quiet("run", "--rm", "--network", "host", *options, image, "true", timeout=120):
                return ContainerLauncher(engine, image, options, prefix)
        if mode == "container":
            raise CheckFailed("runtime", f"no container runs here: `{engine.program} run --rm {image} true` fails")
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        raise CheckFailed("runtime", "no container runs here and the chroot fallback needs root and unshare(1)")
    return ChrootLauncher(engine, image, config, prefix, scratch)


class ContainerProc:
    def __init__(self, engine: Engine, name: str) -> None:
        self.engine = engine
        self.name = name

    def terminate(self) -> None:
        self.engine.quiet("kill", "--signal", "TERM", self.name)

    def wait(self, timeout: float) -> int | None:
        try:
            done = subprocess.run(
                [self.engine.program, "wait", self.name], capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired:
            return None
        code = done.stdout.strip().rpartition("\n")[2]
        return int(code) if done.returncode == 0 and code.lstrip("-").isdigit() else None

    def logs(self) -> str:
        done = subprocess.run([self.engine.program, "logs", self.name], capture_output=True, text=True)
        return done.stdout + done.stderr

    def exit_code(self) -> int | None:
        done = subprocess.run(
            [self.engine.program, "inspect", "--format", "{{.State.Running}} {{.State.ExitCode}}", self.name],
            capture_output=True,
            text=True,
        )
        running, _, code = done.stdout.strip().partition(" ")
        return int(code) if done.returncode == 0 and running == "false" and code.lstrip("-").isdigit() else None

    def uid(self) -> int | None:
        done = subprocess.run(
            [self.engine.program, "inspect", "--format", "{{.State.Pid}}", self.name], capture_output=True, text=True
        )
        pid = done.stdout.strip()
        return process_uid(int(pid)) if done.returncode == 0 and pid.isdigit() and pid != "0" else None


class ContainerLauncher:
    def __init__(self, engine: Engine, image: str, options: list[str], prefix: str) -> None:
        self.engine = engine
        self.image = image
        self.options = ["--network", "host", *options]
        self.prefix = prefix
        self.volume = f"{prefix}-data"  # a named volume starts as a copy of the image's /data (owned by its user)
        self.names: list[str] = []
        self.description = f"container ({engine.program} run {shlex.join(self.options)}, volume on /data)"

    def start(self, name: str, command: list[str] | None, env: dict[str, str]) -> Proc:
        full = f"{self.prefix}-{name}"
        self.names.append(full)
        variables = [arg for key, value in env.items() for arg in ("-e", f"{key}={value}")]
        argv = ["run", "-d", "--name", full, *self.options, "-v", f"{self.volume}:/data", *variables, self.image]
        self.engine(*argv, *(command or []), check=name)
        return ContainerProc(self.engine, full)

    def close(self) -> None:
        for name in self.names:
            self.engine.quiet("kill", name)  # SIGKILL: `rm -f` alone would wait for the stop timeout
            self.engine.quiet("rm", "-f", "-v", name)
        self.engine.quiet("volume", "rm", "-f", self.volume)


class ChrootProc:
    def __init__(self, name: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.name = name
        self.process = process
        self.log = log

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)  # unshare and the helper exec'd: this pid is the image's command

    def wait(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def exit_code(self) -> int | None:
        return self.process.poll()

    def uid(self) -> int | None:
        return process_uid(self.process.pid) if self.process.poll() is None else None

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)  # its own session: the command and its children
            self.process.wait()


class ChrootLauncher:
    def __init__(self, engine: Engine, image: str, config: ImageConfig, prefix: str, scratch: Path) -> None:
        self.config = config
        self.scratch = scratch
        self.root = scratch / "root"
        self.procs: list[ChrootProc] = []
        export_root(engine, image, f"{prefix}-export", self.root)
        self.uid, self.gid, self.home = resolve_user(
            config.user, _read(self.root / "etc/passwd"), _read(self.root / "etc/group")
        )
        self.description = f"chroot of the exported root (uid {self.uid}, gid {self.gid}, workdir {config.workdir})"

    def start(self, name: str, command: list[str] | None, env: dict[str, str]) -> Proc:
        spec = {
            "root": str(self.root),
            "uid": self.uid,
            "gid": self.gid,
            "workdir": self.config.workdir,
            "env": {"HOME": self.home, **self.config.env, **env},
            "argv": self.config.argv(command),
        }
        log = self.scratch / f"{name}-{len(self.procs)}.log"
        # A private mount namespace: the /proc and /dev mounts go away with the process, whatever happens here.
        argv = ["unshare", "--mount", "--propagation", "private", "--", sys.executable, str(CHROOT_EXEC)]
        with log.open("wb") as out:
            process = subprocess.Popen(
                [*argv, json.dumps(spec)], stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        proc = ChrootProc(name, process, log)
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
        shutil.rmtree(self.root, ignore_errors=True)


def export_root(engine: Engine, image: str, name: str, root: Path) -> None:
    """The image's filesystem as a directory: `create` + `export` piped into tar (owners kept as numbers)."""
    root.mkdir(parents=True)
    engine("create", "--name", name, image, "true", check="runtime")
    try:
        with subprocess.Popen([engine.program, "export", name], stdout=subprocess.PIPE) as export:
            untar = subprocess.run(
                ["tar", "-x", "--numeric-owner", "-C", str(root)], stdin=export.stdout, capture_output=True
            )
        if export.returncode != 0 or untar.returncode != 0:
            raise CheckFailed("runtime", f"exporting the image's root failed: {untar.stderr.decode().strip()}")
    finally:
        engine.quiet("rm", "-f", "-v", name)  # -v: the anonymous volume the image's VOLUME made


def resolve_user(user: str, passwd: str, group: str) -> tuple[int, int, str]:
    """An image's `USER` (`name`, `uid`, `name:group`, `uid:gid`) → (uid, gid, home), as the engines read it."""
    name, _, group_name = user.partition(":")
    uid, gid, home = -1, -1, "/"
    for line in passwd.splitlines():
        fields = line.split(":")
        if len(fields) >= 6 and name in (fields[0], fields[2]):
            uid, gid, home = int(fields[2]), int(fields[3]), fields[5]
            break
    else:
        if not name.isdigit():
            raise CheckFailed("runtime", f"the image's user {name!r} is not in its /etc/passwd")
        uid, gid = int(name), 0  # a bare uid unknown to the image runs with group 0, as docker and podman do
    if group_name:
        gid = int(group_name) if group_name.isdigit() else -1
        for line in group.splitlines():
            fields = line.split(":")
            if len(fields) >= 3 and fields[0] == group_name:
                gid = int(fields[2])
        if gid < 0:
            raise CheckFailed("runtime", f"the image's group {group_name!r} is not in its /etc/group")
    return uid, gid, home


def process_uid(pid: int) -> int | None:
    """The real uid of a host process, from /proc (rootful engines: the container's own uid)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = [line.split()[1] for line in status.splitlines() if line.startswith("Uid:")]
    return int(found[0]) if found else None


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""
