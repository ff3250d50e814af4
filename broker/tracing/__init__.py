"""Traces (SPEC S6.1): the narrow interface the rest of the broker calls; OpenTelemetry only behind it.

Off by default: every call then answers shared no-op objects and nothing of OpenTelemetry is imported. The
composition root calls `enable()` once when OTEL_* configuration asks for traces (`Config.otel_traces`);
it imports `broker.tracing.otel` (the `otel` extra) and swaps the one module-level backend.

A job's trace context travels as a W3C `traceparent` string: stored in its JobCreated, so any replica continues
the job's trace (`within(parent)`), and sent to Hermes on every call (`Span.inject`). Span attributes carry ids,
numbers and reasons only, never a prompt, an input or a body.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from enum import StrEnum
from typing import Protocol

#: Attribute values a span takes (None: the attribute is left out).
Value = str | int | float | bool | None
Attributes = Mapping[str, Value]

# Span names.
CREATE = "POST /v1/runs"  #: the create request: the job's root (or a child of the caller's traceparent)
STOP = "POST /v1/runs/{run_id}/stop"  #: a stop request
APPROVAL = "POST /v1/runs/{run_id}/approval"  #: an approval request
ADMISSION = "admission wait"  #: from the job's (re)entry into the line to the grant that submits it
FOLLOW = "follow"  #: one replica following one attempt's Hermes run
TAKEOVER = "takeover"  #: a replica took over a job whose run is live on Hermes
RESUBMIT = "resubmit"  #: an interrupted attempt was resubmitted as the next one
BOARD = "board delivery"  #: one board report version delivered (with its retries)
HERMES_PREFIX = "hermes."  #: hermes.create, hermes.get, hermes.events, hermes.stop, hermes.approval

# Attribute names.
JOB = "job.id"
ATTEMPT = "job.attempt"
STATUS = "job.status"
RUN = "hermes.run_id"
UPSTREAM = "hermes.upstream"  #: host:port of the Hermes base URL


class Kind(StrEnum):
    INTERNAL = "internal"
    SERVER = "server"
    CLIENT = "client"


class Span(Protocol):
    """One span; a context manager that ends it on exit (an exception marks it failed, by its type only)."""

    @property
    def traceparent(self) -> str | None:
        """Its W3C context, for children in other tasks, processes and services (None: tracing is off)."""

    def set(self, name: str, value: Value) -> None: ...

    def fail(self, reason: str) -> None:
        """Mark it failed with a short reason (never a body)."""

    def inject(self, headers: dict[str, str]) -> None:
        """Add its `traceparent` (and `tracestate`) to outgoing headers."""

    def current(self) -> contextlib.AbstractContextManager[None]:
        """Make it the parent of the spans started within (in this task and the tasks it creates)."""

    def end(self) -> None: ...

    def __enter__(self) -> Span: ...

    def __exit__(self, kind: object, error: object, trace: object) -> None: ...


class Backend(Protocol):
    def start(
        self,
        name: str,
        *,
        parent: str | None,
        kind: Kind,
        attributes: Attributes | None,
        start_ms: int | None,
        links: Sequence[str],
    ) -> Span: ...

    def within(self, parent: str | None, attributes: Attributes) -> contextlib.AbstractContextManager[None]: ...

    def shutdown(self) -> None: ...


class _NoSpan:
    """The span of a broker that does not trace: does nothing, costs a method call."""

    __slots__ = ()
    traceparent = None

    def set(self, name: str, value: Value) -> None:
        pass

    def fail(self, reason: str) -> None:
        pass

    def inject(self, headers: dict[str, str]) -> None:
        pass

    def current(self) -> contextlib.AbstractContextManager[None]:
        return NOTHING

    def end(self) -> None:
        pass

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, kind: object, error: object, trace: object) -> None:
        pass


class _Off:
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
        return NO_SPAN

    def within(self, parent: str | None, attributes: Attributes) -> contextlib.AbstractContextManager[None]:
        return NOTHING

    def shutdown(self) -> None:
        pass


NO_SPAN: Span = _NoSpan()
NOTHING: contextlib.AbstractContextManager[None] = contextlib.nullcontext()  #: a block that changes nothing
_OFF = _Off()
_backend: Backend = _OFF


def enabled() -> bool:
    return _backend is not _OFF


def start(
    name: str,
    *,
    parent: str | None = None,
    kind: Kind = Kind.INTERNAL,
    attributes: Attributes | None = None,
    start_ms: int | None = None,
    links: Sequence[str] = (),
) -> Span:
    """A started span: a child of `parent` (a traceparent) if given, else of the current span (if any).

    `start_ms`: epoch milliseconds it began (a wait that began in another process); `links`: traceparents
    of related spans in other traces (a caller's)."""
    return _backend.start(name, parent=parent, kind=kind, attributes=attributes, start_ms=start_ms, links=links)


def within(parent: str | None, attributes: Attributes | None = None) -> contextlib.AbstractContextManager[None]:
    """Spans started within are children of `parent` (None: of the current span) and carry `attributes`
    (as well as those of enclosing `within` blocks)."""
    return _backend.within(parent, attributes or {})


def enable(exporters: Sequence[str] = ("otlp",)) -> bool:
    """Trace from now on through `exporters` (`otlp`, `console`); False when the `otel` extra is not installed
    (tracing stays off)."""
    global _backend
    try:
        from broker.tracing.otel import sdk_backend
    except ImportError:
        return False
    _backend = sdk_backend(exporters)
    return True


def shutdown() -> None:
    """Export what is buffered and stop tracing (at exit)."""
    global _backend
    backend, _backend = _backend, _OFF
    backend.shutdown()


@contextlib.contextmanager
def enabled_with(backend: Backend) -> Iterator[None]:
    """Tests: trace into `backend` within the block."""
    global _backend
    previous, _backend = _backend, backend
    try:
        yield
    finally:
        _backend = previous
