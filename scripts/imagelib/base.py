"""The base image the check builds on: the official python image when it is here or can be pulled, else a
Debian root made from OS packages with mmdebstrap (cached as a tarball, imported as an image)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from imagelib.common import CheckFailed, apt_install, last_line
from imagelib.engine import Engine

OFFICIAL = "docker.io/library/python:3.11-slim"  #: the Dockerfile's default, fully qualified for podman
SUITE = "bookworm"  #: Python 3.11, as the official image
PACKAGES = ["python3", "python3-venv", "ca-certificates", "passwd"]  #: passwd: useradd
DPKG_OPTIONS = [  # what python:3.11-slim leaves out too
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
]
#: An imported tarball has no config at all: give it the PATH every Debian image has.
IMPORT_CHANGES = ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]


@dataclass(frozen=True)
class Base:
    ref: str
    how: str  #: one line for the report


def cache_dir() -> Path:
    root = os.environ.get("HBR_CACHE_DIR") or str(Path.home() / ".cache" / "hermes-bridge-runs")
    return Path(root) / "image"


def mirror() -> str:
    return os.environ.get("HBR_DEBIAN_MIRROR") or "http://deb.debian.org/debian"


def recipe_key() -> str:
    """Names the cached root: another suite, package list, option or mirror makes another root."""
    recipe = "\n".join([SUITE, "minbase", ",".join(PACKAGES), *DPKG_OPTIONS, *IMPORT_CHANGES, mirror()])
    return hashlib.sha256(recipe.encode()).hexdigest()[:12]


def choose_base(engine: Engine, wanted: str) -> Base:
    """`wanted`: `auto` (the official image if local or pullable, else Debian), `debian`, or an image."""
    if wanted not in ("auto", "debian"):
        if engine.image_id(wanted) or engine.quiet("pull", "-q", wanted, timeout=600):
            return Base(wanted, "as given")
        raise CheckFailed("base", f"{wanted} is not here and `{engine.program} pull {wanted}` failed")
    if wanted == "debian":
        return debian_base(engine, "asked for")
    if engine.image_id(OFFICIAL):
        return Base(OFFICIAL, "the official image, already here")
    if engine.quiet("pull", "-q", OFFICIAL, timeout=600):
        return Base(OFFICIAL, "the official image, pulled")
    return debian_base(engine, "no registry reachable")


def debian_base(engine: Engine, why: str) -> Base:
    tag = f"localhost/hermes-bridge-runs-base:{SUITE}-{recipe_key()}"
    what = f"Debian {SUITE} from mmdebstrap ({why})"
    if engine.image_id(tag):
        return Base(tag, f"{what}, image cached")
    tarball = cache_dir() / f"base-{SUITE}-{recipe_key()}.tar"
    made = "root cached" if tarball.is_file() else "root made now"
    if not tarball.is_file():
        make_root(tarball)
    changes = [arg for change in IMPORT_CHANGES for arg in ("--change", change)]
    engine("import", *changes, str(tarball), tag, check="base", timeout=600)
    return Base(tag, f"{what}, {made}, imported")


def make_root(tarball: Path) -> None:
    if shutil.which("mmdebstrap") is None:
        apt_install(["mmdebstrap"], "base")
    tarball.parent.mkdir(parents=True, exist_ok=True)
    partial = tarball.with_name(f"{tarball.stem}.{os.getpid()}.partial.tar")
    argv = [
        "mmdebstrap",
        "--quiet",
        "--variant=minbase",
        "--format=tar",
        f"--include={','.join(PACKAGES)}",
        *(f"--dpkgopt={option}" for option in DPKG_OPTIONS),
        SUITE,
        str(partial),
        mirror(),
    ]
    try:
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        partial.unlink(missing_ok=True)
        raise CheckFailed("base", f"mmdebstrap took longer than 900 s: run `{' '.join(argv)}` by hand") from None
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        errors = [line.strip() for line in done.stderr.splitlines() if line.startswith(("E:", "W:"))]
        reason = errors[0] if errors else last_line(done.stderr or done.stdout)  # the cause, not "failed to run"
        argv[argv.index(str(partial))] = str(tarball)
        raise CheckFailed("base", f"mmdebstrap exited {done.returncode} ({reason}): try `{' '.join(argv)}`")
    os.replace(partial, tarball)  # a concurrent or interrupted run never leaves half a root under the final name
