"""What Prometheus gets (SPEC S7, S3.8): a broker process's /metrics has no `_created` series, and every metric that
the shipped alerting rules (deploy/prometheus/alerts.yaml) name is one that /metrics serves; each rule says what it
means and what to do."""

from __future__ import annotations

import re
import urllib.request
from typing import Any

import yaml

from tests.conftest import RedisServer
from tests.e2e.conftest import ROOT, BrokerFactory, SimulatorProcess, until
from tests.e2e.test_takeover import FAST, create_jobs, statuses

RULES = ROOT / "deploy" / "prometheus" / "alerts.yaml"
#: What an expression holds besides metric names: label lists, matchers, ranges, strings, numbers, durations.
_NOT_NAMES = [
    re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)"),
    re.compile(r"\{[^}]*\}"),
    re.compile(r"\[[^\]]*\]"),
    re.compile(r'"[^"]*"'),
]
_IDENTIFIER = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\b(\s*\()?")
_KEYWORDS = {"and", "or", "unless", "offset", "bool", "by", "without", "on", "ignoring", "group_left", "group_right"}
#: The sample names each exported type adds to its family's name.
_SUFFIXES = {
    "counter": [""],
    "gauge": [""],
    "histogram": ["_bucket", "_sum", "_count"],
    "summary": ["", "_sum", "_count"],
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (not its functions, keywords or label names)."""
    for pattern in _NOT_NAMES:
        expr = pattern.sub(" ", expr)
    names = set()
    for match in _IDENTIFIER.finditer(expr):
        name, call = match.group(1), match.group(2)
        if call or name in _KEYWORDS or re.fullmatch(r"\d+[smhdwy]?", name):
            continue
        names.add(name)
    return names


def served_names(text: str) -> set[str]:
    """Every sample name /metrics exports: each `# TYPE` family with its type's suffixes (a labelled family without
    children yet has no sample, but is served)."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, family, kind = line.split()
            names.update(family + suffix for suffix in _SUFFIXES[kind])
    return names


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_the_expression_reader_finds_metrics_only() -> None:
    expr = (
        '(max by (upstream) (hbr_a) == 1) unless on (upstream) sum(rate(hbr_b_total{outcome="x"}[5m])) > 0.9'
        " and on () max(hbr_c offset 1h)"
    )
    assert metric_names(expr) == {"hbr_a", "hbr_b_total", "hbr_c"}


def _scrape(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as answer:
        return bytes(answer.read()).decode()


def test_metrics_have_no_created_series_and_serve_every_metric_the_alerts_name(
    start_broker: BrokerFactory, clean_redis: RedisServer, simulator: SimulatorProcess
) -> None:
    # Given a broker process that drove a job to its end (counters and histograms with samples)
    broker = start_broker(redis_url=clean_redis.url, **FAST, HERMES_URL=simulator.url)
    jobs = create_jobs(broker, 1, "hello")
    until(lambda: statuses(broker, jobs) == ["completed"], 30)
    # When Prometheus scrapes it
    text = _scrape(broker.url)
    # Then no series is a `_created` one
    samples = [line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert "hbr_jobs_created_total" in samples and "hbr_hermes_call_seconds_count" in samples
    assert [name for name in samples if name.endswith("_created")] == []
    assert "_created " not in text and "_created{" not in text
    # And every metric of every alert's expression is served, and each alert says what it is and what to do
    served = served_names(text)
    shipped = rules()
    assert len(shipped) >= 6
    for rule in shipped:
        named = metric_names(str(rule["expr"]))
        assert named, rule["alert"]
        assert named <= served, (rule["alert"], named - served)
        assert rule["annotations"]["summary"].strip() and rule["annotations"]["what_to_do"].strip(), rule["alert"]
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
    alerts = " ".join(str(rule["expr"]) for rule in shipped)
    for needed in (
        "hbr_oldest_queued_seconds",
        "hbr_upstream_unreachable",
        "hbr_upstream_refusing",
        "hbr_board_deliveries_total",
        "hbr_ready",
        "hbr_redis_memory_guard_ratio",
        "hbr_takeovers_total",
    ):
        assert needed in alerts, needed


#: `sum(increase(<counter>[<range>m])) > <threshold>`: the shape of the takeover rule, evaluated below.
_SUM_INCREASE = re.compile(r"^sum\(increase\((\w+)\[(\d+)m\]\)\) > (\d+)$")


def _fires(rule: dict[str, Any], takeovers_at_s: list[float], horizon_s: int) -> bool:
    """Whether the rule fires on a fleet whose takeovers happened at these times (one each), evaluated every 15 s
    as Prometheus does: the summed increase over the range, true at every evaluation for the `for:` duration."""
    found = _SUM_INCREASE.match(str(rule["expr"]).strip())
    assert found, rule["expr"]
    range_s, threshold = int(found.group(2)) * 60, int(found.group(3))
    hold_s = int(str(rule["for"]).removesuffix("m")) * 60
    pending_since: int | None = None
    for now in range(0, horizon_s, 15):
        increase = sum(1 for at in takeovers_at_s if now - range_s < at <= now)
        if increase <= threshold:
            pending_since = None
            continue
        pending_since = now if pending_since is None else pending_since
        if now - pending_since >= hold_s:
            return True
    return False


def test_the_takeover_alert_stays_quiet_through_a_rolling_restart_and_fires_on_a_crash_loop() -> None:
    (rule,) = [rule for rule in rules() if rule["alert"] == "HermesBridgeTakeoversSpiking"]
    # A rolling restart of 4 replicas, one a minute, each handing 60 running jobs back on SIGTERM (the replica
    # that picks a handed-back job up counts it as a takeover), then again an hour later
    rollout = [start + replica * 60 + job * 0.1 for start in (600, 4200) for replica in range(4) for job in range(60)]
    assert not _fires(rule, rollout, 7200)
    # A replica that crashes every 5 minutes for an hour with 20 jobs each time
    crash_loop = [600 + crash * 300 + job * 0.1 for crash in range(12) for job in range(20)]
    assert _fires(rule, crash_loop, 7200)
