"""`bench.py --against REF`: the same rows for this checkout and for another commit, round by round, side by side.

The other commit is unpacked (`git archive`) under the cache directory with a virtualenv of its own (on top of this
Python's packages, so nothing is downloaded for what both need), and its own `scripts/bench.py` measures it: each
side's figures come with its own baseline from the same round, and the rounds alternate (this checkout, then the
other), so a machine that slows down mid-run slows both. The table shows each side's ratio to its baseline (or
target) and the quotient of the two: above 1 where this checkout's ratio is the larger.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
from dataclasses import dataclass, field
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "hermes-bridge-runs" / "bench-against"


class AgainstError(Exception):
    """The other commit could not be found, unpacked or installed (the message says which)."""


def commit_of(ref: str) -> str:
    """The full hash of `ref` in this repository."""
    found = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=ROOT, capture_output=True,
                           text=True, check=False)  # fmt: skip
    if found.returncode != 0:
        raise AgainstError(f"--against {ref}: no such commit here ({found.stderr.strip() or 'git rev-parse failed'})")
    return found.stdout.strip()


def prepare(commit: str) -> Path:
    """The commit's tree with its own virtualenv (made once, then reused): the directory its bench runs in."""
    place = CACHE / commit
    python = place / ".venv" / "bin" / "python"
    if python.exists():
        return place
    archive = subprocess.run(["git", "archive", "--format=tar", commit], cwd=ROOT, capture_output=True, check=False)
    if archive.returncode != 0:
        raise AgainstError(f"--against {commit[:12]}: git archive failed: {archive.stderr.decode().strip()}")
    place.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(place, filter="data")
    steps = [
        [sys.executable, "-m", "venv", "--system-site-packages", str(place / ".venv")],
        [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-deps", "-e", str(place)],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            python.unlink(missing_ok=True)  # half made: made again next time
            raise AgainstError(f"--against {commit[:12]}: {' '.join(step[:4])}… failed: {done.stderr.strip()[-500:]}")
    return place


def one_round(python: str, checkout: Path, options: list[str]) -> tuple[list[dict[str, Any]], str]:
    """One round of `checkout`'s bench (its JSON rows), or no rows and what went wrong."""
    command = [python, str(checkout / "scripts" / "bench.py"), "--json", "--rounds", "1", *options]
    done = subprocess.run(command, cwd=checkout, capture_output=True, text=True, check=False)
    try:
        rows = json.loads(done.stdout)["rows"]
    except (ValueError, KeyError, TypeError):
        return [], f"exit {done.returncode}: {done.stderr.strip()[-400:]}"
    return rows, ""


@dataclass
class Side:
    """One checkout's samples per row (name, unit), over the rounds."""

    broker: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    baseline: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    ideal: dict[tuple[str, str], float] = field(default_factory=dict)
    errors: dict[tuple[str, str], str] = field(default_factory=dict)

    def add(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            key = (row["name"], row["unit"])
            if row.get("error"):
                self.errors[key] = row["error"]
                continue
            self.broker.setdefault(key, []).extend((row.get("broker") or {}).get("samples", []))
            self.baseline.setdefault(key, []).extend((row.get("baseline") or {}).get("samples", []))
            if row.get("ideal") is not None:
                self.ideal[key] = row["ideal"]

    def ratio(self, key: tuple[str, str]) -> float | None:
        """Its median against its baseline's median (or the ideal); without either, its median itself."""
        samples = self.broker.get(key)
        if not samples:
            return None
        reference = statistics.median(self.baseline[key]) if self.baseline.get(key) else self.ideal.get(key)
        middle = statistics.median(samples)
        return middle if reference in (None, 0) else middle / reference


def shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(ours: Side, theirs: Side, ref: str) -> str:
    lines = [f"| scenario | unit | this checkout: ratio | {ref}: ratio | quotient |", "| --- | --- | --- | --- | --- |"]
    keys = list(dict.fromkeys([*ours.broker, *ours.errors, *theirs.broker, *theirs.errors]))
    for key in keys:
        mine, other = ours.ratio(key), theirs.ratio(key)
        quotient = None if mine is None or other in (None, 0) else mine / other
        left = f"ERROR: {ours.errors[key]}" if key in ours.errors else shown(mine)
        right = f"ERROR: {theirs.errors[key]}" if key in theirs.errors else shown(other)
        name = key[0].replace("|", "\\|")
        lines.append(f"| {name} | {key[1]} | {left} | {right.replace('|', '/')} | {shown(quotient)} |")
    return "\n".join(lines)


def run(place: Path, rounds: int, options: list[str]) -> int:
    """Alternate `rounds` rounds of this checkout's bench and the one `prepare` made ready at `place`; print the
    side-by-side table. 1 when this checkout's bench failed (the other's failures are shown, never fatal: it may
    predate a row)."""
    commit = place.name
    ours, theirs = Side(), Side()
    failed = False
    for number in range(1, rounds + 1):
        print(f"bench: round {number} of {rounds}: this checkout", file=sys.stderr, flush=True)
        rows, problem = one_round(sys.executable, ROOT, options)
        failed |= bool(problem) or any(row.get("error") for row in rows)
        if problem:
            print(f"bench: this checkout's round failed: {problem}", file=sys.stderr)
        ours.add(rows)
        print(f"bench: round {number} of {rounds}: {commit[:12]}", file=sys.stderr, flush=True)
        rows, problem = one_round(str(place / ".venv" / "bin" / "python"), place, options)
        if problem:
            print(f"bench: {commit[:12]}'s round failed: {problem}", file=sys.stderr)
        theirs.add(rows)
    print(table(ours, theirs, commit[:12]))
    print(f"\n{rounds} alternating rounds; quotient = this checkout's ratio / {commit[:12]}'s ratio")
    return 1 if failed else 0
