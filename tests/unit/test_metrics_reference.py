"""The metrics reference (docs/reference/metrics.md) names every metric of the broker's registry with its type and
labels, and nothing else: it cannot drift from the code."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from prometheus_client.metrics import MetricWrapperBase

from broker.metrics import Metrics

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference" / "metrics.md"
#: | `name` | type | `label`, `label` | meaning |
ROW = re.compile(r"^\| `(?P<name>hbr_[a-z0-9_]+)` \| (?P<type>\w+) \|(?P<labels>[^|]*)\| (?P<meaning>[^|]+) \|$")

Described = tuple[str, str, tuple[str, ...]]


def _collectors(value: object) -> Iterator[MetricWrapperBase]:
    if isinstance(value, MetricWrapperBase):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _collectors(item)


def _exposed(metric: MetricWrapperBase) -> Described:
    """(name as scraped, type, label names): a counter's samples end in `_total`."""
    name = metric._name + "_total" if metric._type == "counter" else metric._name
    return name, metric._type, tuple(metric._labelnames)


def _registry() -> set[Described]:
    return {_exposed(metric) for value in vars(Metrics()).values() for metric in _collectors(value)}


def _documented() -> list[Described]:
    rows = []
    for line in REFERENCE.read_text().splitlines():
        match = ROW.match(line)
        if match:
            assert match["meaning"].strip(), line
            labels = tuple(label.strip().strip("`") for label in match["labels"].split(",") if label.strip())
            rows.append((match["name"], match["type"], labels))
    return rows


def test_every_metric_is_documented_with_its_type_and_labels_and_nothing_else() -> None:
    documented = _documented()
    assert len(documented) == len(set(documented)), "a metric is documented twice"
    assert set(documented) == _registry()


def test_every_table_row_of_the_reference_is_read() -> None:
    rows = [line for line in REFERENCE.read_text().splitlines() if line.startswith("| `")]
    assert len(rows) == len(_documented()), "a row does not have the form | `name` | type | labels | meaning |"
