"""broker.tracing.failures: an exporter's failures as rate-limited log-contract lines; OpenTelemetry's own lines
kept out of the log, as the notes of the failed export or as fixed-sentence lines."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from broker.tracing.failures import (
    LIBRARY_LOGGER,
    REPORT_EVERY_S,
    LoggedExporter,
    Throttle,
    capture_library_lines,
)

SPANS: Sequence[ReadableSpan] = (ReadableSpan(name="a"), ReadableSpan(name="b"))
LIBRARY = logging.getLogger(f"{LIBRARY_LOGGER}.exporter.otlp.proto.http.trace_exporter")


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Scripted(SpanExporter):
    """Answers each export with the next outcome; logs as OpenTelemetry's exporters do when it fails."""

    def __init__(self) -> None:
        self.outcome: SpanExportResult | Exception = SpanExportResult.FAILURE

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if isinstance(self.outcome, Exception):
            raise self.outcome
        if self.outcome is SpanExportResult.FAILURE:
            LIBRARY.warning("Transient error %s encountered while exporting span batch.", "Connection refused")
            LIBRARY.error("Failed to export span batch due to timeout, max retries or shutdown.")
        return self.outcome

    def shutdown(self) -> None:
        pass


@pytest.fixture
def library_lines() -> Iterator[None]:
    library = logging.getLogger(LIBRARY_LOGGER)
    handlers, propagate = list(library.handlers), library.propagate
    capture_library_lines()
    yield
    library.handlers[:], library.propagate = handlers, propagate


def _lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, dict[str, object]]]:
    fields = ("exporter", "endpoint", "failed", "spans", "error", "source", "detail", "repeated")
    return [(r.levelname, r.getMessage(), {f: getattr(r, f) for f in fields if hasattr(r, f)}) for r in caplog.records]


def test_failures_are_one_warn_line_a_minute_counting_what_failed_meanwhile(
    caplog: pytest.LogCaptureFixture, library_lines: None
) -> None:
    # Given an OTLP exporter whose collector is down, and a clock
    clock, inner = Clock(), Scripted()
    exporter = LoggedExporter(inner, "otlp", "collector:4318", Throttle(clock))
    caplog.set_level(logging.DEBUG)
    # When it fails three times within a minute
    for _ in range(3):
        assert exporter.export(SPANS) is SpanExportResult.FAILURE
        clock.now += 10
    # Then one warn line says so, naming the first thing OpenTelemetry said, and nothing of its own text is logged
    first = {
        "exporter": "otlp",
        "endpoint": "collector:4318",
        "failed": 1,
        "spans": 2,
        "error": "Transient error Connection refused encountered while exporting span batch.",
    }
    assert _lines(caplog) == [("WARNING", "Could not export traces.", first)]
    # When a minute has passed and it fails again: the next line counts the two held back and this one
    clock.now += REPORT_EVERY_S
    exporter.export(SPANS)
    assert _lines(caplog)[1:] == [("WARNING", "Could not export traces.", {**first, "failed": 3, "spans": 6})]
    # When it fails once more, then exports again: one line says so, with what failed since the last
    exporter.export(SPANS)
    inner.outcome = SpanExportResult.SUCCESS
    exporter.export(SPANS)
    exporter.export(SPANS)
    again = {"exporter": "otlp", "endpoint": "collector:4318", "failed": 1, "spans": 2}
    assert _lines(caplog)[2:] == [("INFO", "Exporting traces again.", again)]


def test_an_exporter_that_raises_fails_its_export_with_the_error_type_only(caplog: pytest.LogCaptureFixture) -> None:
    inner = Scripted()
    inner.outcome = ConnectionError("secret-bearing text")
    exporter = LoggedExporter(inner, "console")
    assert exporter.export(SPANS) is SpanExportResult.FAILURE
    assert _lines(caplog) == [
        (
            "WARNING",
            "Could not export traces.",
            {"exporter": "console", "failed": 1, "spans": 2, "error": "ConnectionError"},
        )
    ]


def test_failures_held_back_are_reported_when_the_exporter_stops(
    caplog: pytest.LogCaptureFixture, library_lines: None
) -> None:
    clock, inner = Clock(), Scripted()
    exporter = LoggedExporter(inner, "otlp", "collector:4318", Throttle(clock))
    for _ in range(3):
        exporter.export(SPANS)
    exporter.shutdown()
    assert [message for _, message, _ in _lines(caplog)] == ["Could not export traces.", "Stopped exporting traces."]
    assert _lines(caplog)[1][2] == {"exporter": "otlp", "endpoint": "collector:4318", "failed": 2, "spans": 4}


def test_opentelemetrys_own_lines_become_fixed_sentences_a_minute_apart(
    caplog: pytest.LogCaptureFixture, library_lines: None
) -> None:
    # Given OpenTelemetry's loggers routed through the broker's
    caplog.set_level(logging.DEBUG)
    sdk = logging.getLogger(f"{LIBRARY_LOGGER}.sdk.trace")
    # When the SDK warns the same thing three times, another thing once, and says something at info
    for spans in (1, 2, 3):
        sdk.warning("Queue full, dropping %s span(s).", spans)
    sdk.error("Invalid attribute %r.", "x")
    sdk.info("Shutdown called.")
    # Then each kind is one line with a fixed sentence, the text as a field; info is left out
    assert _lines(caplog) == [
        (
            "WARNING",
            "OpenTelemetry reported a problem.",
            {"source": sdk.name, "detail": "Queue full, dropping 1 span(s).", "repeated": 1},
        ),
        (
            "ERROR",
            "OpenTelemetry reported a problem.",
            {"source": sdk.name, "detail": "Invalid attribute 'x'.", "repeated": 1},
        ),
    ]
    assert all(not record.name.startswith(LIBRARY_LOGGER) for record in caplog.records)
