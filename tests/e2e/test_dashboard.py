"""The Grafana dashboard (deploy/grafana/hermes-bridge-runs.json) names only series a running broker exports."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import RedisServer
from tests.e2e.conftest import ROOT, BrokerFactory

DASHBOARD = ROOT / "deploy" / "grafana" / "hermes-bridge-runs.json"
#: what the dashboard must show, by panel title
PANELS = {
    "Queued depth",
    "Oldest queued age",
    "Live runs per upstream",
    "Creates per second",
    "Refusals",
    "Board deliveries",
    "Takeovers and resubmits",
    "Redis memory",
}
#: every query asks the data source the dashboard's variable picks at import
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
#: every query asks the data source that the dashboard's variable picks at import
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SERIES = re.compile(r"\b(?:hbr|redis)_[a-z0-9_]+\b")


def exported(text: str) -> set[str]:
    """Every series name the exposition can carry, samples or not (a labelled counter with no child has none)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ()))
        names.update(sample.name for sample in family.samples)
    return names


def named_series(expr: str) -> set[str]:
    return set(SERIES.findall(re.sub(r'"[^"]*"', '""', expr)))  # label values (reason="redis_memory") are no series


def test_every_panel_names_series_the_broker_exports(start_broker: BrokerFactory, clean_redis: RedisServer) -> None:
    # Given a running broker and the dashboard
    broker = start_broker(redis_url=clean_redis.url)
    dashboard = json.loads(Path(DASHBOARD).read_text())

    # When its /metrics is read
    with urllib.request.urlopen(f"{broker.url}/metrics", timeout=5) as answer:
        names = exported(answer.read().decode())

    # Then every panel has queries, and every series they name is the broker's
    panels = dashboard["panels"]
    assert PANELS <= {panel["title"] for panel in panels}
    for panel in panels:
        exprs = [target["expr"] for target in panel["targets"]]
        assert exprs, panel["title"]
        series = set().union(*(named_series(expr) for expr in exprs))
        assert series, panel["title"]
        assert not series - names, (panel["title"], sorted(series - names))
        assert not any(name.endswith("_created") for name in series), panel["title"]  # the counters' timestamps
        assert all(target["datasource"] == DATASOURCE for target in panel["targets"]), panel["title"]
