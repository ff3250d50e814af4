"""broker.tracing: no-op and import-free when off; with the SDK, W3C context in and out, inherited attributes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from broker import tracing
from broker.tracing.otel import SdkBackend
from tests.e2e.conftest import ROOT

PARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with tracing.enabled_with(SdkBackend(provider)):
        yield exporter
    provider.shutdown()


def _run(*parts: str) -> str:
    code = "\n".join(textwrap.dedent(part) for part in parts)
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


#: Builds the whole app and calls every tracing entry point while tracing is off; prints the OpenTelemetry
#: modules imported before (by third-party packages alone) and after.
_APP_WITHOUT_TRACES = """
    import sys
    def otel():
        return sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry")
    import aiohttp, redis, redis.asyncio, redis.asyncio.cluster  # redis-py 8 imports the OTel SDK when present
    before = otel()
    import broker.__main__
    from broker import tracing
    from broker.config import Config
    from broker.app import create_app
    create_app(Config(), redis_url="redis://127.0.0.1:1")
    with tracing.start(tracing.CREATE) as span, span.current(), tracing.within(span.traceparent, {"a": 1}):
        span.inject({})
    print(before == otel(), "broker.tracing.otel" in sys.modules)
"""

#: Makes OpenTelemetry unimportable, as in an install without the `otel` extra.
_NO_OTEL = """
    import sys
    class NoOtel:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "opentelemetry":
                raise ImportError(name)
    sys.meta_path.insert(0, NoOtel())
"""


@pytest.mark.parametrize("extra", ["installed", "missing"])
def test_the_broker_imports_nothing_of_opentelemetry_unless_traces_are_configured(extra: str) -> None:
    # Given a process that builds the app and calls tracing while it is off, with or without the extra
    parts = (_NO_OTEL, _APP_WITHOUT_TRACES) if extra == "missing" else (_APP_WITHOUT_TRACES,)
    # Then it works, and the broker itself imported no module of OpenTelemetry
    assert _run(*parts) == "True False"


def test_without_the_extra_enabling_traces_fails_softly() -> None:
    # Given a process where OpenTelemetry cannot be imported (the `otel` extra not installed)
    code = """
        from broker import tracing
        print(tracing.enable(("otlp",)), tracing.enabled(), tracing.start(tracing.CREATE).traceparent)
    """
    # Then enabling says so and tracing stays off
    assert _run(_NO_OTEL, code) == "False False None"


def test_off_every_call_answers_the_shared_no_op_span() -> None:
    assert not tracing.enabled()
    span = tracing.start(tracing.CREATE, parent=PARENT, attributes={tracing.JOB: "job_1"})
    assert span is tracing.NO_SPAN and span.traceparent is None
    headers: dict[str, str] = {}
    span.inject(headers)
    assert headers == {}


def test_a_span_continues_a_stored_traceparent_and_hands_on_its_own(exported: InMemorySpanExporter) -> None:
    # Given a stored trace context
    with tracing.start(tracing.TAKEOVER, parent=PARENT, attributes={tracing.JOB: "job_1", "none": None}) as span:
        traceparent = span.traceparent
        headers: dict[str, str] = {}
        span.inject(headers)
    [finished] = exported.get_finished_spans()
    context = finished.get_span_context()
    assert context is not None and finished.parent is not None
    # Then the span is its child, and its own context goes out as W3C headers
    assert (f"{context.trace_id:032x}", f"{finished.parent.span_id:016x}") == (PARENT[3:35], PARENT[36:52])
    assert traceparent == headers["traceparent"] == f"00-{context.trace_id:032x}-{context.span_id:016x}-01"
    assert dict(finished.attributes or {}) == {tracing.JOB: "job_1"}  # None values are left out


def test_spans_within_inherit_the_parent_and_the_attributes(exported: InMemorySpanExporter) -> None:
    with tracing.within(PARENT, {tracing.JOB: "job_1"}):
        with tracing.within(None, {tracing.ATTEMPT: 2}):
            outer = tracing.start(tracing.FOLLOW)
            with outer.current():
                tracing.start("hermes.get", attributes={tracing.RUN: "run_1"}).end()
            outer.end()
        tracing.start(tracing.RESUBMIT).end()
    tracing.start(tracing.CREATE).end()  # outside: a root of its own, no inherited attributes
    spans: dict[str, ReadableSpan] = {span.name: span for span in exported.get_finished_spans()}
    trace_id = int(PARENT[3:35], 16)
    assert all(spans[name].context.trace_id == trace_id for name in (tracing.FOLLOW, "hermes.get", tracing.RESUBMIT))
    get, follow = spans["hermes.get"], spans[tracing.FOLLOW]
    assert get.parent is not None and get.parent.span_id == follow.context.span_id
    assert dict(get.attributes or {}) == {tracing.JOB: "job_1", tracing.ATTEMPT: 2, tracing.RUN: "run_1"}
    assert dict(spans[tracing.RESUBMIT].attributes or {}) == {tracing.JOB: "job_1"}
    assert spans[tracing.CREATE].parent is None and not spans[tracing.CREATE].attributes
    assert spans[tracing.CREATE].context.trace_id != trace_id


def test_a_failing_block_marks_its_span_by_the_error_type_only(exported: InMemorySpanExporter) -> None:
    with pytest.raises(ValueError), tracing.start(tracing.CREATE):
        raise ValueError("input: a secret prompt")
    [finished] = exported.get_finished_spans()
    assert finished.status.description == "ValueError"
    assert not finished.events  # no exception event with the message
