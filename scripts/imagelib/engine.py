"""The container engine (podman, else a docker with a daemon, else podman installed from the OS packages) and
what the check asks of it: build, inspect, import, pull, export, run."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from imagelib.common import CheckFailed, apt_install, run

#: podman runs its build steps with chroot isolation: no OCI runtime, cgroups or rlimits needed for a build.
PODMAN_BUILD = ["--isolation", "chroot"]
#: What installing podman brings: runc too, because crun refuses hosts with hybrid cgroups.
PODMAN_PACKAGES = ["podman", "runc"]


@dataclass(frozen=True)
class ImageConfig:
    """The parts of an image's config that say how to run it (`podman image inspect` → `Config`)."""

    user: str
    workdir: str
    env: dict[str, str]
    entrypoint: list[str]
    cmd: list[str]
    volumes: list[str]
    ports: list[str]
    stop_signal: str
    size_mb: float = 0.0
    labels: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_inspect(cls, image: dict[str, Any]) -> ImageConfig:
        config = image.get("Config") or {}
        env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
        return cls(
            user=config.get("User") or "root",
            workdir=config.get("WorkingDir") or "/",
            env=env,
            entrypoint=list(config.get("Entrypoint") or []),
            cmd=list(config.get("Cmd") or []),
            volumes=sorted(config.get("Volumes") or {}),
            ports=sorted(config.get("ExposedPorts") or {}),
            stop_signal=config.get("StopSignal") or "SIGTERM",
            size_mb=float(image.get("Size") or 0) / 1e6,
            labels=dict(config.get("Labels") or {}),
        )

    def argv(self, command: list[str] | None = None) -> list[str]:
        """What the image runs: its entrypoint followed by `command` or its own CMD (as `podman run` does)."""
        return [*self.entrypoint, *(command if command is not None else self.cmd)]


@dataclass(frozen=True)
class Engine:
    """podman or docker, by the name of its client."""

    program: str
    version: str
    installed: bool = False

    def __call__(self, *args: str, check: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run([self.program, *args], check, timeout=timeout)

    def quiet(self, *args: str, timeout: float = 60) -> bool:
        """Runs a command whose failure is an answer, not an error."""
        try:
            done = subprocess.run([self.program, *args], capture_output=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0

    def image_id(self, ref: str) -> str | None:
        done = subprocess.run(
            [self.program, "image", "inspect", "--format", "{{.Id}}", ref], capture_output=True, text=True
        )
        return done.stdout.strip() if done.returncode == 0 and done.stdout.strip() else None

    def inspect(self, ref: str) -> ImageConfig:
        images = json.loads(self("image", "inspect", ref, check="config").stdout)
        return ImageConfig.from_inspect(images[0])

    def build(self, context: Path, tag: str, base: str, ca_bundle: Path | None) -> None:
        args = ["build", "--network", "host", "--build-arg", f"BASE_IMAGE={base}", "-t", tag]
        if self.program == "podman":
            args += PODMAN_BUILD
        if ca_bundle is not None:
            args += ["--secret", f"id=pip_cert,src={ca_bundle}"]
        done = subprocess.run(
            [self.program, *args, str(context)],
            capture_output=True,
            text=True,
            timeout=1200,
            env={**os.environ, "DOCKER_BUILDKIT": "1"},  # docker: RUN --mount needs BuildKit
        )
        if done.returncode != 0:
            lines = (done.stdout + done.stderr).strip().splitlines()
            raise CheckFailed("build", f"`{self.program} build` exited {done.returncode}: " + " | ".join(lines[-4:]))

    def remove_image(self, image_id: str) -> None:
        self.quiet("image", "rm", image_id)


def find_engine(preferred: str | None) -> Engine:
    """podman when installed, else docker when its daemon answers, else podman installed from the OS packages."""
    for program in [preferred] if preferred else ["podman", "docker"]:
        engine = _usable(program)
        if engine is not None:
            return engine
    if preferred == "docker":
        raise CheckFailed("engine", "docker has no daemon to talk to: start one (`dockerd`) or use --engine podman")
    apt_install(PODMAN_PACKAGES, "engine")
    engine = _usable("podman")
    if engine is None:
        raise CheckFailed("engine", "podman was installed but `podman info` fails: run `podman info` to see why")
    return Engine(engine.program, engine.version, installed=True)


def _usable(program: str) -> Engine | None:
    if shutil.which(program) is None:
        return None
    try:
        # `info` needs the daemon (docker) or usable storage (podman); the docker client alone is not enough.
        info = subprocess.run([program, "info", "--format", "{{json .}}"], capture_output=True, text=True, timeout=60)
        version = subprocess.run([program, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if info.returncode != 0 or version.returncode != 0:
        return None
    found = re.search(r"\d+\.\d+(\.\d+)?", version.stdout)
    return Engine(program, found.group(0) if found else version.stdout.strip())


def host_ca_bundle() -> Path | None:
    """The CA bundle the host's own pip trusts (it may hold an intercepting proxy's CA), handed to the build."""
    for name in ("PIP_CERT", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):
        value = os.environ.get(name)
        if value and Path(value).is_file():
            return Path(value)
    default = Path("/etc/ssl/certs/ca-certificates.crt")
    return default if default.is_file() else None
