"""What every part of the image check shares: the failure, the one-line-per-check report, commands, ports."""

from __future__ import annotations

import os
import shlex
import shutil
import socket
import subprocess
import sys
import time


class CheckFailed(Exception):
    """Raised when a check fails: `check` names it, `reason` says what was seen (one line)."""

    def __init__(self, check: str, reason: str) -> None:
        super().__init__(f"{check}: {reason}")
        self.check = check
        self.reason = reason


class Report:
    """Prints one line per check: `ok    <check>  <detail>  (<seconds> s)`, and the total at the end."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.passed = 0
        self._mark = self.started

    def ok(self, check: str, detail: str) -> None:
        now = time.monotonic()
        print(f"ok    {check:<10} {detail}  ({now - self._mark:.1f} s)", flush=True)
        self._mark = now
        self.passed += 1

    def restart_clock(self) -> None:
        """The next line's time starts now (not at the last line): teardown is nobody's check."""
        self._mark = time.monotonic()

    def failed(self, error: CheckFailed) -> None:
        print(f"FAIL  {error.check:<10} {error.reason}", flush=True)

    def elapsed(self) -> float:
        return time.monotonic() - self.started


def run(
    argv: list[str], check: str, *, timeout: float = 120, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs a command; a non-zero exit or a timeout fails `check` with the command and its last output line."""
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise CheckFailed(check, f"`{shlex.join(argv)}` took longer than {timeout:.0f} s") from None
    except OSError as error:
        raise CheckFailed(check, f"`{shlex.join(argv)}` could not start: {error}") from None
    if done.returncode != 0:
        raise CheckFailed(
            check, f"`{shlex.join(argv)}` exited {done.returncode}: {last_line(done.stderr or done.stdout)}"
        )
    return done


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def apt_install(packages: list[str], check: str) -> None:
    """Installs OS packages with apt-get (as root); fails `check` naming the command to run when it cannot."""
    command = f"apt-get install -y --no-install-recommends {' '.join(packages)}"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise CheckFailed(check, f"{' and '.join(packages)} missing and not installable here: run `sudo {command}`")
    print(f"      installing {' '.join(packages)} from the OS packages", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages]
    if subprocess.run(argv, env=env, capture_output=True, timeout=600).returncode == 0:
        return
    # A fresh machine may have no package lists yet.
    updated = subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, text=True, timeout=600)
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if updated.returncode != 0 or done.returncode != 0:
        reason = last_line(done.stderr or updated.stderr or done.stdout)
        raise CheckFailed(check, f"could not install {' '.join(packages)} ({reason}): run `{command}`")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def fail_exit(report: Report, error: CheckFailed) -> None:
    report.failed(error)
    print(f"image-check: FAILED at {error.check} after {report.elapsed():.0f} s", file=sys.stderr, flush=True)
