"""Import direction (STYLE B.2, C.3): pure layers stay pure, the store and the Hermes client stay apart, and the
Hermes simulator shares no code with the broker it stands in for."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_IN_PROJECTIONS = {"redis", "aiohttp", "logging", "time", "random", "uuid", "secrets", "datetime", "os"}


def _imports(path: Path) -> set[str]:
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    return _imports_of(path.read_text(), package)


def _imports_of(source: str, package: str) -> set[str]:
    """Absolute module names a source imports (relative imports resolved against `package`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(part for part in (base, node.module or "") if part)
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def _files(folder: str) -> list[Path]:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"no modules under {folder}"
    return files


def _top(module: str) -> str:
    return module.split(".")[0]


# Known violations, reported to their owners; strict: the mark fails once the import is gone.
KNOWN_VIOLATIONS: dict[str, str] = {}


def _projection_modules() -> list[object]:
    return [
        pytest.param(path, id=path.name, marks=pytest.mark.xfail(strict=True, reason=KNOWN_VIOLATIONS[path.name]))
        if path.name in KNOWN_VIOLATIONS
        else pytest.param(path, id=path.name)
        for path in _files("projections")
    ]


@pytest.mark.parametrize("path", _projection_modules())
def test_projections_import_only_events_attrs_and_the_pure_stdlib(path: Path) -> None:
    for module in _imports(path):
        top = _top(module)
        if top == "projections" or top == "attrs" or top == "__future__":
            continue
        if top == "broker":
            assert module == "broker.events" or module.startswith("broker.events."), f"{path}: {module}"
            continue
        assert top in sys.stdlib_module_names, f"{path} imports {module}"
        assert top not in FORBIDDEN_IN_PROJECTIONS, f"{path} imports {module}"


@pytest.mark.parametrize("path", _files("broker/store"), ids=lambda p: p.name)
def test_the_store_never_imports_http_hermes_or_driver(path: Path) -> None:
    for module in _imports(path):
        assert not module.startswith(("broker.http", "broker.hermes", "broker.driver")), f"{path}: {module}"


@pytest.mark.parametrize("path", _files("broker/hermes"), ids=lambda p: p.name)
def test_the_hermes_client_never_imports_the_store(path: Path) -> None:
    for module in _imports(path):
        assert not module.startswith(("broker.store", "broker.driver", "broker.http")), f"{path}: {module}"


@pytest.mark.parametrize("path", _files("broker/simulator"), ids=lambda p: p.name)
def test_the_simulator_shares_no_code_with_the_broker(path: Path) -> None:
    # STYLE C.3: the contract suite tests the broker's Hermes client against this stand-in; a module both
    # import (broker.hermes.models above all) would carry the same mistake into both, unnoticed.
    for module in _imports(path):
        if _top(module) == "broker":
            assert module == "broker.simulator" or module.startswith("broker.simulator."), f"{path}: {module}"


def test_the_checker_sees_every_kind_of_import() -> None:
    source = (
        "import redis\nfrom aiohttp import web\nfrom broker.store import keys\nfrom . import job\nimport time as t\n"
    )
    found = _imports_of(source, "projections")
    assert {"redis", "aiohttp.web", "broker.store.keys", "projections.job", "time"} <= found
    assert _imports_of("from ..store import keys\n", "broker.http") >= {"broker.store.keys"}


#: The board's pure parts (what a job write persists of the board, and its rendering) that the writer folds in.
PURE_BOARD = ("broker.board.projector", "broker.board.report")


@pytest.mark.parametrize("path", _files("broker/jobs"), ids=lambda p: p.name)
def test_the_job_use_cases_stand_below_every_edge(path: Path) -> None:
    # http, driver and board stand on broker/jobs (STYLE §C.1): no arrow points back up
    for module in _imports(path):
        if module.startswith(PURE_BOARD):
            continue
        assert not module.startswith(("broker.http", "broker.driver", "broker.board")), f"{path}: {module}"


@pytest.mark.parametrize("path", _files("broker/driver"), ids=lambda p: p.name)
def test_the_driver_never_sees_http(path: Path) -> None:
    for module in _imports(path):
        assert not module.startswith("broker.http"), f"{path}: {module}"


@pytest.mark.parametrize("path", _files("broker/http"), ids=lambda p: p.name)
def test_the_http_edge_never_reaches_up_into_the_driver_the_board_or_the_console(path: Path) -> None:
    # STYLE C.1: the composition root (broker/app.py) wires those; the edge serves what it is handed
    for module in _imports(path):
        assert not module.startswith(("broker.driver", "broker.board", "broker.console", "broker.app")), (
            f"{path}: {module}"
        )


@pytest.mark.parametrize("path", _files("broker/board"), ids=lambda p: p.name)
def test_the_board_reads_only_the_drivers_pure_rules(path: Path) -> None:
    # STYLE C.2: what both read (the S2 policy) lives below both, in broker/jobs; board repair applies the driver's
    # pure rule for a polled run (decide.on_status), nothing else of the driver
    for module in _imports(path):
        if module.startswith("broker.driver"):
            assert module in ("broker.driver", "broker.driver.decide"), f"{path}: {module}"
