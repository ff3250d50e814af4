"""The trace exporters' own failures as log-contract lines (the `otel` extra; imported by `broker.tracing.otel`).

An exporter that fails (a collector that is down, refuses or times out) is reported in one warn line per
exporter at most every REPORT_EVERY_S, counting the failed exports and lost spans since its previous line; its
first success after a reported failure says so once. OpenTelemetry's own free-text log lines are kept out of the
broker's log: those written while an export runs become that failure's `error`, the others a fixed-sentence line
per kind, rate-limited the same way.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from broker.logging import get_logger

REPORT_EVERY_S = 60.0  #: at most one line per kind of failure this often
ERROR_CHARS = 300  #: an `error` field is cut to this length
LIBRARY_LOGGER = "opentelemetry"
Clock = Callable[[], float]


class Throttle:
    """When a kind of failure may be logged again: its first one, then once REPORT_EVERY_S has passed.

    Counts what was held back meanwhile, so the next line says how much happened since the previous one."""

    def __init__(self, clock: Clock = time.monotonic, every_s: float = REPORT_EVERY_S) -> None:
        self._clock = clock
        self._every_s = every_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()  # exporters run in the SDK's threads

    def allow(self, kind: str) -> int | None:
        """None: hold this one back; else the number of occurrences the line stands for (this one included)."""
        with self._lock:
            now = self._clock()
            last = self._last.get(kind)
            if last is not None and now - last < self._every_s:
                self._held[kind] = self._held.get(kind, 0) + 1
                return None
            self._last[kind] = now
            return self._held.pop(kind, 0) + 1


class _Notes(threading.local):
    """What OpenTelemetry logged in this thread while an export ran (None: no export is running here)."""

    lines: list[str] | None = None


_NOTES = _Notes()


class LoggedExporter(SpanExporter):
    """An exporter whose failures are logged by the broker's contract, rate-limited; it never raises."""

    def __init__(self, inner: SpanExporter, name: str, endpoint: str = "", throttle: Throttle | None = None) -> None:
        self._inner = inner
        self._name = name
        self._endpoint = endpoint
        self._throttle = throttle or Throttle()
        self._lock = threading.Lock()
        self._failed = 0  #: failed exports since the last line
        self._lost = 0  #: spans they carried
        self._reported = False  #: a failure was logged and no export succeeded since
        self._log = get_logger(type(self))

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        _NOTES.lines = []
        try:
            result = self._inner.export(spans)
            error = _NOTES.lines[0] if _NOTES.lines else "export failed"
        except Exception as failure:  # the exporter's thread guard: a line here, not the SDK's traceback
            result, error = SpanExportResult.FAILURE, type(failure).__name__
        finally:
            _NOTES.lines = None
        if result is SpanExportResult.SUCCESS:
            self._succeeded()
        else:
            self._failure(len(spans), error)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()
        with self._lock:
            failed, lost, self._failed, self._lost = self._failed, self._lost, 0, 0
        if failed:
            self._log.warning("Stopped exporting traces.", extra={**self._fields(), "failed": failed, "spans": lost})

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self._inner.force_flush(timeout_millis)

    def _failure(self, spans: int, error: str) -> None:
        with self._lock:
            self._failed += 1
            self._lost += spans
            if self._throttle.allow(self._name) is None:
                return
            failed, lost, self._failed, self._lost = self._failed, self._lost, 0, 0
            self._reported = True
        extra = {**self._fields(), "failed": failed, "spans": lost, "error": error[:ERROR_CHARS]}
        self._log.warning("Could not export traces.", extra=extra)

    def _succeeded(self) -> None:
        with self._lock:
            if not self._reported:
                return
            failed, lost, self._failed, self._lost, self._reported = self._failed, self._lost, 0, 0, False
        self._log.info("Exporting traces again.", extra={**self._fields(), "failed": failed, "spans": lost})

    def _fields(self) -> dict[str, str]:
        fields = {"exporter": self._name}
        if self._endpoint:
            fields["endpoint"] = self._endpoint
        return fields


class LibraryLines(logging.Handler):
    """OpenTelemetry's own log records: notes of the export running in this thread, else one fixed-sentence
    line per kind (its logger and message template), rate-limited, with the text as `detail`."""

    def __init__(self, throttle: Throttle | None = None) -> None:
        super().__init__()
        self._throttle = throttle or Throttle()
        self._log = get_logger(type(self))

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if _NOTES.lines is not None:
            _NOTES.lines.append(text)
            return
        if record.levelno < logging.WARNING:
            return
        repeated = self._throttle.allow(f"{record.name}:{record.msg}")
        if repeated is None:
            return
        extra = {"source": record.name, "detail": text[:ERROR_CHARS], "repeated": repeated}
        self._log.log(record.levelno, "OpenTelemetry reported a problem.", extra=extra)


def capture_library_lines() -> None:
    """Route OpenTelemetry's loggers through `LibraryLines` only (idempotent)."""
    library = logging.getLogger(LIBRARY_LOGGER)
    library.handlers[:] = [handler for handler in library.handlers if not isinstance(handler, LibraryLines)]
    library.addHandler(LibraryLines())
    library.propagate = False
