"""Traces beside the logs (SPEC S6, S6.1), in real broker processes: console spans never share stdout with the
JSON log lines, and an unreachable collector is one log-contract warn line, not OpenTelemetry's free text."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

from tests.conftest import RedisServer
from tests.e2e.conftest import BrokerFactory, BrokerProcess, until

JSON = {"Content-Type": "application/json"}


def _log_records(path: Path) -> list[dict[str, Any]]:
    """Every stdout line as a log record; fails on a line that is not one."""
    records = []
    for line in path.read_text().splitlines():
        record = json.loads(line)  # a span's pretty-printed JSON (or any free text) fails here
        assert isinstance(record, dict) and {"level", "message", "context"} <= set(record), line
        records.append(record)
    return records


def _create(broker: BrokerProcess) -> None:
    status, body = broker.request("POST", "/v1/runs", {"input": "hello"}, **JSON)
    assert status == 202, body


def test_console_spans_go_to_stderr_and_stdout_holds_log_lines_only(
    start_broker: BrokerFactory, clean_redis: RedisServer
) -> None:
    # Given a broker exporting spans to the console, its stderr kept apart from its stdout
    broker = start_broker(
        redis_url=clean_redis.url, split_stderr=True, OTEL_TRACES_EXPORTER="console", OTEL_BSP_SCHEDULE_DELAY="100"
    )
    assert broker.stderr_path is not None
    # When a job is created (its create request is a span)
    _create(broker)
    until(lambda: '"name": "POST /v1/runs"' in broker.stderr_path.read_text(), 15, "the create's span on stderr")
    assert broker.terminate() == 0
    # Then every stdout line is a log line, and the spans are on stderr
    records = _log_records(broker.log_path)
    assert any(r["message"] == "Created a job." for r in records)
    assert "trace_id" not in broker.log_path.read_text()


def test_an_unreachable_collector_is_one_warn_line_of_the_log_contract(
    start_broker: BrokerFactory, clean_redis: RedisServer
) -> None:
    # Given a broker exporting over OTLP to a port nothing listens on (each export fails at once)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    broker = start_broker(
        redis_url=clean_redis.url,
        OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{port}",
        OTEL_EXPORTER_OTLP_TIMEOUT="0.5",
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    # When jobs are created a few batches apart, so that several exports fail within seconds
    for _ in range(5):
        _create(broker)
        time.sleep(0.3)
    until(lambda: "Could not export traces." in broker.log_path.read_text(), 15, "the failure's line")
    assert broker.terminate() == 0

    # Then the log holds log lines only, none of them OpenTelemetry's
    records = _log_records(broker.log_path)
    assert not [r for r in records if r["context"].startswith("opentelemetry")]
    # and one warn line says that the export failed, with the exporter, the collector's host and the reason
    [failed] = [r for r in records if r["message"] == "Could not export traces."]
    assert failed["level"] == "warn"
    assert (failed["exporter"], failed["endpoint"], failed["failed"]) == ("otlp", f"127.0.0.1:{port}", 1)
    assert failed["spans"] >= 1 and failed["error"]
    # and the failures held back since then are counted once, when the broker stops
    [stopped] = [r for r in records if r["message"] == "Stopped exporting traces."]
    assert stopped["level"] == "warn" and stopped["failed"] >= 2
