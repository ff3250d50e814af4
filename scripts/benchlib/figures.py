"""Figures of the benchmark: samples per round, their median and range, the Markdown table and the JSON."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Row:
    """One line of the table: the broker's samples beside a measured baseline's, or beside a target."""

    name: str
    unit: str
    broker: list[float] = field(default_factory=list)
    baseline: list[float] = field(default_factory=list)
    target: str = ""  #: shown in the baseline column when there is no measured baseline
    ideal: float | None = None  #: a target figure to take the ratio against
    note: str = ""
    error: str = ""

    def ratio(self) -> float | None:
        reference = statistics.median(self.baseline) if self.baseline else self.ideal
        if not self.broker or reference is None or reference == 0:
            return None
        ratio = statistics.median(self.broker) / reference
        return None if math.isnan(ratio) else ratio

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "unit": self.unit, "broker": summary(self.broker),
                "baseline": summary(self.baseline) if self.baseline else None, "target": self.target or None,
                "ideal": self.ideal, "ratio": self.ratio(), "note": self.note or None,
                "error": self.error or None}  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0..100) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def summary(samples: list[float]) -> dict[str, Any] | None:
    if not samples:
        return None
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples), "n": len(samples),
            "samples": samples}  # fmt: skip


def number(value: float) -> str:
    if math.isnan(value):
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def cell(samples: list[float]) -> str:
    if not samples:
        return "-"
    middle = number(statistics.median(samples))
    if len(samples) == 1:
        return f"{middle} (n=1)"
    return f"{middle} ({number(min(samples))}-{number(max(samples))}, n={len(samples)})"


def escape(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(rows: list[Row]) -> str:
    lines = ["| scenario | unit | broker: median (min-max, rounds) | baseline / target | broker / baseline |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for row in rows:
        if row.error:
            lines.append(f"| {escape(row.name)} | {row.unit} | ERROR: {escape(row.error)} | | |")
            continue
        reference = cell(row.baseline) if row.baseline else (row.target or "-")
        ratio = row.ratio()
        shown = "-" if ratio is None else f"{ratio:.2f}x"
        name = escape(f"{row.name} ({row.note})" if row.note else row.name)
        lines.append(f"| {name} | {row.unit} | {cell(row.broker)} | {reference} | {shown} |")
    return "\n".join(lines)


def as_json(rows: list[Row], meta: dict[str, Any]) -> str:
    return json.dumps({"meta": meta, "rows": [row.as_json() for row in rows]}, indent=1)
