"""`bench.py --against`: each side's ratio to its own baseline, and the quotient of the two."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import pytest
from benchlib.against import AgainstError, Side, commit_of, table


def row(name: str, broker: list[float], baseline: list[float] | None = None, **extra: object) -> dict[str, object]:
    return {"name": name, "unit": "jobs/s", "broker": {"samples": broker},
            "baseline": {"samples": baseline} if baseline else None, **extra}  # fmt: skip


def test_each_side_is_measured_against_its_own_baseline_over_the_rounds() -> None:
    ours, theirs = Side(), Side()
    ours.add([row("e2e", [90], [100])])
    ours.add([row("e2e", [110], [100])])  # a second round: medians over both
    theirs.add([row("e2e", [40], [80]), row("makespan", [2.2], ideal=2.0)])
    assert ours.ratio(("e2e", "jobs/s")) == 1.0
    assert theirs.ratio(("e2e", "jobs/s")) == 0.5
    assert theirs.ratio(("makespan", "jobs/s")) == 2.2 / 2.0
    lines = table(ours, theirs, "abc").splitlines()
    assert lines[2] == "| e2e | jobs/s | 1.000 | 0.500 | 2.000 |"
    assert lines[3] == "| makespan | jobs/s | - | 1.100 | - |"  # a row only the other commit has


def test_an_error_on_either_side_is_shown_in_its_column() -> None:
    ours, theirs = Side(), Side()
    ours.add([row("e2e", [1], [1]), {"name": "cluster", "unit": "req/s", "error": "RuntimeError: no cluster"}])
    theirs.add([row("e2e", [1], [2])])
    shown = table(ours, theirs, "abc")
    assert "| cluster | req/s | ERROR: RuntimeError: no cluster | - | - |" in shown
    assert "| e2e | jobs/s | 1.000 | 0.500 | 2.000 |" in shown


def test_a_ref_that_is_not_a_commit_here_is_named() -> None:
    with pytest.raises(AgainstError, match="no-such-ref-anywhere"):
        commit_of("no-such-ref-anywhere")
