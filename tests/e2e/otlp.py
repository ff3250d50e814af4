"""A real OTLP/HTTP trace receiver for the tracing tests: `POST /v1/traces` (protobuf, decoded with
opentelemetry-proto) keeps every span; `POST /board` answers 200 (a board receiver, so deliveries are traced)."""

from __future__ import annotations

import gzip
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from attrs import frozen
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

KINDS = {1: "internal", 2: "server", 3: "client", 4: "producer", 5: "consumer"}


@frozen
class ReceivedSpan:
    trace_id: str
    span_id: str
    parent_span_id: str
    name: str
    kind: str
    attributes: dict[str, Any]
    resource: dict[str, Any]
    links: tuple[tuple[str, str], ...]  #: (trace id, span id)
    start_ns: int
    end_ns: int


def _value(value: AnyValue) -> Any:
    field = value.WhichOneof("value")
    return None if field is None else getattr(value, field)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class OtlpReceiver:
    """Started on a free loopback port in a thread; `spans()` is what every exporter sent so far."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self.boards = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path == "/v1/traces":
                    receiver._keep(ExportTraceServiceRequest.FromString(body))
                    answer = ExportTraceServiceResponse().SerializeToString()
                    content_type = "application/x-protobuf"
                else:
                    with receiver._lock:
                        receiver.boards += 1
                    answer, content_type = b"{}", "application/json"
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)
        self._thread.start()

    def _keep(self, request: ExportTraceServiceRequest) -> None:
        received = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    links = tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links)
                    received.append(
                        ReceivedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=KINDS.get(span.kind, str(span.kind)),
                            attributes=_attributes(span.attributes),
                            resource=resource,
                            links=links,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                        )
                    )
        with self._lock:
            self._spans.extend(received)

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)
