"""The arq baseline's own virtualenv: arq pins redis-py < 6, which the broker cannot use, so it never shares
the broker's environment. Created once under ~/.cache/hermes-bridge-runs/bench-arq (about 10 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

VENV = Path.home() / ".cache" / "hermes-bridge-runs" / "bench-arq"
PACKAGES = ["arq>=0.26,<1", "aiohttp>=3.10"]


def arq_python() -> str:
    """The virtualenv's python, with arq installed; created when missing."""
    python = VENV / "bin" / "python"
    marker = VENV / ".installed"
    if not marker.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *PACKAGES], check=True
        )
        marker.write_text(" ".join(PACKAGES))
    return str(python)
