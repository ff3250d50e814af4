"""The docs site builds with `mkdocs build --strict`; its configuration reference is the config module's."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from broker.config import _VARIABLES, PREFIXES

ROOT = Path(__file__).resolve().parents[2]
#: a variable name with one of the broker's prefixes, not followed by `_*` (a family such as `BOARD_*`)
NAMED = re.compile(rf"\b(?:{'|'.join(prefix.rstrip('_') for prefix in PREFIXES)})_[A-Z0-9_]*[A-Z0-9]\b(?!_\*)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        message = "mkdocs-material is not installed (pip install -e '.[dev]')"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    target = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(target)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return target


def test_the_site_builds_strictly(site: Path) -> None:
    assert (site / "index.html").is_file()
    assert (site / "operations" / "backup" / "index.html").is_file()


def test_the_configuration_reference_lists_every_variable_and_no_other(site: Path) -> None:
    page = (site / "reference" / "configuration" / "index.html").read_text()
    listed = re.findall(r"<tr>\s*<td><code>([A-Z_*]+)</code></td>", page)
    assert sorted(listed) == sorted([*_VARIABLES, "OTEL_*"])
    assert len(listed) == len(set(listed))


def test_the_docs_and_the_readme_name_only_variables_the_broker_reads() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    unknown = {
        f"{page.relative_to(ROOT)}: {name}"
        for page in pages
        for name in NAMED.findall(page.read_text())
        if name not in _VARIABLES
    }
    assert not unknown


def test_every_shipped_alert_has_its_what_to_do_in_the_alerts_page() -> None:
    import yaml  # MkDocs's own dependency

    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "alerts.yaml").read_text())
    names = {rule["alert"] for group in rules["groups"] for rule in group["rules"]}
    page = (ROOT / "docs" / "operations" / "alerts.md").read_text()
    assert names, "no alert rules"
    assert not {name for name in names if f"`{name}`" not in page}
