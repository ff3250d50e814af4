"""The OpenTelemetry backend of `broker.tracing` (the `otel` extra): SDK spans exported over OTLP/HTTP.

Imported only by `broker.tracing.enable()`. The SDK reads its own standard variables (OTEL_SERVICE_NAME,
OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, OTEL_BSP_*, OTEL_EXPORTER_OTLP_*); which exporters run is decided
in `broker.config` (`Config.otel_traces`). Context travels as W3C trace context only.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextvars import ContextVar
from urllib.parse import urlsplit

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.trace import Link, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from broker.tracing import Attributes, Kind, Span, Value
from broker.tracing.failures import LoggedExporter, capture_library_lines

SERVICE = "hermes-bridge-runs"
#: How long an exit waits for buffered spans to be exported (a collector that is down must not hold a drain).
EXIT_FLUSH_S = 2.0
_PROPAGATOR = TraceContextTextMapPropagator()
_KINDS = {
    Kind.INTERNAL: trace.SpanKind.INTERNAL,
    Kind.SERVER: trace.SpanKind.SERVER,
    Kind.CLIENT: trace.SpanKind.CLIENT,
}
#: Attributes every span started within a `within` block gets (the job id of a runner's task, say).
_INHERITED: ContextVar[Mapping[str, Value]] = ContextVar("broker_tracing_inherited", default={})  # noqa: B039


class SdkSpan:
    __slots__ = ("_span",)

    def __init__(self, span: trace.Span) -> None:
        self._span = span

    @property
    def traceparent(self) -> str | None:
        context = self._span.get_span_context()  # formatted here: the propagator costs several times more
        if not context.is_valid:
            return None
        return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"

    def set(self, name: str, value: Value) -> None:
        if value is not None:
            self._span.set_attribute(name, value)

    def fail(self, reason: str) -> None:
        self._span.set_status(Status(StatusCode.ERROR, reason))

    def inject(self, headers: dict[str, str]) -> None:
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(self._span))

    def current(self) -> contextlib.AbstractContextManager[None]:
        return _using(self._span)

    def end(self) -> None:
        self._span.end()

    def __enter__(self) -> SdkSpan:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        if error is not None:
            self.fail(type(error).__name__)  # the type only: an exception's text may quote a body
        self.end()


class SdkBackend:
    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer("broker")

    def start(
        self,
        name: str,
        *,
        parent: str | None,
        kind: Kind,
        attributes: Attributes | None,
        start_ms: int | None,
        links: Sequence[str],
    ) -> Span:
        inherited = _INHERITED.get()
        merged = {**inherited, **attributes} if attributes else inherited
        span = self._tracer.start_span(
            name,
            context=_context_of(parent) if parent else None,
            kind=_KINDS[kind],
            attributes={key: value for key, value in merged.items() if value is not None},
            links=[Link(context) for context in map(_span_context, links) if context.is_valid],
            start_time=None if start_ms is None else start_ms * 1_000_000,
            record_exception=False,  # an exception's text may quote a body
            set_status_on_exception=False,
        )
        return SdkSpan(span)

    def within(self, parent: str | None, attributes: Attributes) -> contextlib.AbstractContextManager[None]:
        return _within(parent, attributes)

    def shutdown(self) -> None:
        """Export what is buffered, waiting at most EXIT_FLUSH_S (the exporter retries for far longer)."""
        flusher = threading.Thread(target=self._provider.shutdown, name="otel-shutdown", daemon=True)
        flusher.start()
        flusher.join(EXIT_FLUSH_S)


def sdk_backend(exporters: Sequence[str] = ("otlp",)) -> SdkBackend:
    """A backend exporting through `exporters` (`otlp`, `console`) in batches (OTEL_BSP_* tune them)."""
    # The sampler: OTEL_TRACES_SAMPLER, parent-based by default. No atexit hook: `shutdown()` bounds the flush.
    provider = TracerProvider(resource=_resource(), shutdown_on_exit=False)
    capture_library_lines()  # the SDK's own lines, and the exporters' failures, as the log contract's
    for exporter in exporters:
        provider.add_span_processor(_processor(_exporter(exporter)))
    return SdkBackend(provider)


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return LoggedExporter(ConsoleSpanExporter(out=sys.stderr), name)  # stdout holds the JSON log lines only
    exporter = OTLPSpanExporter()  # OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, _HEADERS, _TIMEOUT, _COMPRESSION
    return LoggedExporter(exporter, name, _endpoint_host(exporter))


def _endpoint_host(exporter: OTLPSpanExporter) -> str:
    """`host:port` of the exporter's endpoint: never its credentials, path or query."""
    parts = urlsplit(str(getattr(exporter, "_endpoint", "")))
    try:
        port = parts.port
    except ValueError:
        port = None
    host = parts.hostname or ""
    return f"{host}:{port}" if host and port else host


def _processor(exporter: SpanExporter) -> SpanProcessor:
    return BatchSpanProcessor(exporter)


def _resource() -> Resource:
    """OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES win; else the project's name and this process."""
    detected = dict(Resource.create().attributes)
    if str(detected.get(SERVICE_NAME, "")).startswith("unknown_service"):
        del detected[SERVICE_NAME]
    instance = f"{socket.gethostname()}-{os.getpid()}"
    return Resource({SERVICE_NAME: SERVICE, "service.instance.id": instance, **detected})


def _context_of(traceparent: str) -> otel_context.Context:
    return _PROPAGATOR.extract({"traceparent": traceparent})


def _span_context(traceparent: str) -> trace.SpanContext:
    return trace.get_current_span(_context_of(traceparent)).get_span_context()


@contextlib.contextmanager
def _within(parent: str | None, attributes: Attributes) -> Iterator[None]:
    inherited = _INHERITED.set({**_INHERITED.get(), **attributes}) if attributes else None
    token = otel_context.attach(_context_of(parent)) if parent else None
    try:
        yield
    finally:
        if token is not None:
            otel_context.detach(token)
        if inherited is not None:
            _INHERITED.reset(inherited)


@contextlib.contextmanager
def _using(span: trace.Span) -> Iterator[None]:
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        yield
    finally:
        otel_context.detach(token)
