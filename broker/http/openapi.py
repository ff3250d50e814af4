"""The broker's OpenAPI 3.1 document, served at GET /openapi.json: every route, its parameters, bodies and answers,
and every error code of the envelope.

The document is data built here (the schemas are in `openapi_schemas.py`). Tests hold it to the code: every route
the app registers is documented and every documented route is registered, every error code the code can answer is
in `broker.errors.ERROR_CODES`, the README's route table names only documented routes and codes, and a
schema-driven fuzzer checks every answer of a running broker against it.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from aiohttp import web

from broker.errors import ERROR_CODES
from broker.events import JobStatus
from broker.http import openapi_ready as ready
from broker.http import openapi_schemas as s
from broker.http import openapi_usage as usage
from broker.http.listing import MAX_LIMIT
from broker.http.render import json_response
from broker.http.schemas import MAX_KEY_LENGTH, MAX_SESSION_KEY_LENGTH
from broker.http.sse import EVENT_ID

Schema = dict[str, Any]

_STATUSES = "|".join(status.value for status in JobStatus)

#: Codes any route may answer: the request could not be parsed as HTTP, or its line or headers are too long.
PROTOCOL_CODES = ("bad_request", "uri_too_long", "header_too_large")
OUTAGE_CODES = ("unavailable",)
CHANGE_CODES = ("cross_site_request", "unavailable", "busy")
RUN_ID = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
LISTING = [
    {
        "name": "status",
        "in": "query",
        "schema": {"type": "string", "pattern": f"^({_STATUSES})(,({_STATUSES}))*$"},
        "description": "Statuses, comma-separated (default: all).",
    },
    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": 50}},
    {
        "name": "cursor",
        "in": "query",
        "schema": {"type": "string", "minLength": 1},
        "description": "The previous page's next_cursor.",
    },
]
RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait.", "schema": {"type": "integer"}}}


def _json(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


def _errors(*codes: str) -> dict[str, Schema]:
    """The error answers of `codes` (with the protocol codes), one per status, each naming the codes it may carry."""
    by_status: dict[int, list[str]] = {}
    for code in (*codes, *PROTOCOL_CODES):
        by_status.setdefault(ERROR_CODES[code][0], []).append(code)
    answers: dict[str, Schema] = {}
    for status, named in sorted(by_status.items()):
        narrowed = {"properties": {"error": {"properties": {"code": {"enum": named}}}}}
        answer: Schema = {
            "description": "; ".join(f"`{code}`: {ERROR_CODES[code][1]}" for code in named),
            "content": _json({"allOf": [s.ref("Error"), narrowed]}),
        }
        if status in (429, 503):
            answer["headers"] = RETRY_AFTER
        answers[str(status)] = answer
    return answers


def _ok(description: str, schema: Schema, status: str = "200", **extra: Any) -> dict[str, Schema]:
    return {status: {"description": description, "content": _json(schema), **extra}}


def _links(*targets: str) -> dict[str, Schema]:
    """OpenAPI links from an answer that carries `run_id` to the operations on that job."""
    return {target: {"operationId": target, "parameters": {"run_id": "$response.body#/run_id"}} for target in targets}


def _operation(operation_id: str, summary: str, responses: dict[str, Schema], **extra: Any) -> Schema:
    return {"operationId": operation_id, "summary": summary, "responses": responses, **extra}


def _runs() -> dict[str, Schema]:
    created = _ok(
        "The job, stored in Redis, in status `queued` (or the original job, replayed by an Idempotency-Key).",
        s.ref("CreatedJob"),
        "202",
        headers={"Idempotency-Replayed": {"description": "`true` on a replay.", "schema": {"type": "string"}}},
        links=_links("getRun", "streamEvents", "stopRun", "approveRun"),
    )
    create_codes = (
        "invalid_json", "missing_input", "invalid_input", "invalid_field", "invalid_context", "invalid_reporting",
        "invalid_scheduling", "invalid_idempotency_key", "invalid_session_key", "idempotency_key_conflict",
        "invalid_callback", "session_busy", "body_too_large", "queue_full", *CHANGE_CODES,
    )  # fmt: skip
    return {
        "get": _operation(
            "listRuns",
            "List the broker's jobs, most recently changed first",
            {**_ok("A page of jobs.", s.ref("JobList")), **_errors("invalid_field", *OUTAGE_CODES)},
            parameters=LISTING,
        ),
        "post": _operation(
            "createRun",
            "Create a job (Hermes's create, answered at once)",
            {**created, **_errors(*create_codes)},
            parameters=[
                _header(
                    "Idempotency-Key",
                    {"type": "string", "minLength": 1, "maxLength": MAX_KEY_LENGTH, "pattern": "^[!-~]+$"},
                ),
                _header(
                    "X-Hermes-Session-Key",
                    {"type": "string", "maxLength": MAX_SESSION_KEY_LENGTH, "pattern": "^[^\\x00-\\x1f\\x7f-\\x9f]*$"},
                ),
            ],
            requestBody={"required": True, "content": _json(s.ref("CreateRun"))},
        ),
    }


def _header(name: str, schema: Schema) -> Schema:
    return {"name": name, "in": "header", "required": False, "schema": schema}


def _run() -> dict[str, Schema]:
    # a path that decodes to more segments is no route of the broker's: 404 `not_found`
    found = _ok(
        "The job object (or a Hermes run, relayed).",
        {"oneOf": [s.ref("Job"), s.ref("HermesRun")]},
        links=_links("streamEvents", "stopRun", "approveRun"),
    )
    return {
        "get": _operation(
            "getRun",
            "A job (or, with RUNS_PROXY_ENABLED, a Hermes run relayed)",
            {**found, **_errors("run_not_found", "not_found", "bad_gateway", *OUTAGE_CODES)},
            parameters=[RUN_ID],
        )
    }


def _events() -> dict[str, Schema]:
    event_id = {"type": "string", "pattern": f"^{EVENT_ID.pattern}$"}
    resume = {"type": "string", "pattern": f"^({EVENT_ID.pattern})?$"}  # empty counts as absent
    stream = {
        "description": "Server-sent events: frames of an `id:` line and a `data:` line holding an `Event`, no `event:`"
        " line; `: keepalive` comments while quiet; one terminal event, then `: stream closed`. A relayed Hermes"
        " run's frames have no `id:` line.",
        # each event of the stream (OpenAPI 3.1 reads an event stream's `schema` as one event's)
        "content": {
            "text/event-stream": {
                "schema": s.obj(
                    {
                        "id": event_id,
                        "data": {
                            "type": "string",
                            "contentMediaType": "application/json",
                            "contentSchema": s.ref("Event"),
                        },
                    },
                    ["data"],
                )
            }
        },
    }
    return {
        "get": _operation(
            "streamEvents",
            "The job's events: replayed from the start (or after the given id), then live",
            {"200": stream, **_errors("invalid_last_event_id", "run_not_found", "not_found", *OUTAGE_CODES)},
            parameters=[
                RUN_ID,
                {"name": "after", "in": "query", "schema": resume, "description": "Resume strictly after this id."},
                _header("Last-Event-ID", resume) | {"description": "Wins over `after`; empty counts as absent."},
            ],
        )
    }


def _stop() -> dict[str, Schema]:
    stopped = _ok(
        "The job's status after the stop: `cancelled` at once when no Hermes run is live, else `stopping`.",
        s.ref("Stopped"),
        links=_links("getRun", "streamEvents", "approveRun"),
    )
    return {
        "post": _operation(
            "stopRun",
            "Stop a job",
            {**stopped, **_errors("run_not_found", "not_found", "bad_gateway", *CHANGE_CODES)},
            parameters=[RUN_ID],
        )
    }


def _approval() -> dict[str, Schema]:
    codes = (
        "invalid_json", "invalid_approval_choice", "approval_choice_not_allowed", "body_too_large", "run_not_found",
        "not_found",
        "approval_not_active", "approval_not_pending", "bad_gateway", *CHANGE_CODES,
    )  # fmt: skip
    return {
        "post": _operation(
            "approveRun",
            "Answer the job's pending approval (relayed to its live Hermes run); `deny` stops the job",
            {**_ok("Hermes's answer.", s.ref("ApprovalAnswer"), links=_links("getRun", "stopRun")), **_errors(*codes)},
            parameters=[RUN_ID],
            requestBody={"required": True, "content": _json(s.ref("Approval"))},
        )
    }


def _usage() -> dict[str, Schema]:
    return {
        "get": _operation(
            "getUsage",
            "What the fairness keys used: one key's hourly or daily buckets, or the keys with most Hermes seconds",
            {**_ok("The key's buckets, or the top keys.", usage.ANSWER), **_errors("invalid_field", *OUTAGE_CODES)},
            parameters=usage.PARAMETERS,
        )
    }


def _operations() -> dict[str, Schema]:
    html = {"text/html": {"schema": {"type": "string"}}}
    ready = {"description": "Ready (200) or not (503, with `reason`).", "content": _json(s.ref("Ready"))}
    return {
        "/healthz": {"get": _operation("healthz", "200 while the process serves", _ok("Serving.", s.ref("Health")))},
        "/readyz": {"get": _operation("readyz", "Readiness and the admission state", {"200": ready, "503": ready})},
        "/metrics": {
            "get": _operation(
                "metrics",
                "Prometheus metrics",
                {"200": {"description": "Prometheus text.", "content": {"text/plain": {"schema": {"type": "string"}}}}},
            )
        },
        "/openapi.json": {
            "get": _operation(
                "openapi", "This document", _ok("The OpenAPI document.", {"type": "object", "required": ["openapi"]})
            )
        },
        "/console": {
            "get": _operation(
                "console",
                "The operator console's overview (404 with CONSOLE_ENABLED=false)",
                {"200": {"description": "The overview page.", "content": html}, **_errors("invalid_field")},
                parameters=LISTING,
            )
        },
        "/console/jobs/{job_id}": {
            "get": _operation(
                "consoleJob",
                "The operator console's page of a job",
                {
                    "200": {"description": "The job's page.", "content": html},
                    "404": {"description": "The not-found page.", "content": html},
                },
                parameters=[{**RUN_ID, "name": "job_id"}],
            )
        },
        "/console/usage": {
            "get": _operation(
                "consoleUsage",
                "The operator console's usage page: the keys that used most Hermes time over 24 h and 7 d",
                {"200": {"description": "The usage page.", "content": html}},
            )
        },
        "/console/static/{name}": {
            "get": _operation(
                "consoleStatic",
                "The console's script and stylesheet",
                {
                    "200": {
                        "description": "The file.",
                        "content": {
                            "text/javascript": {"schema": {"type": "string"}},
                            "text/css": {"schema": {"type": "string"}},
                        },
                    },
                    **_errors("not_found"),
                },
                parameters=[{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
            )
        },
    }


TAGS = {
    "runs": "Hermes's /v1/runs API: jobs, their events, stops and approvals (and the broker's listing and usage).",
    "console": "The operator console (HTML).",
    "operations": "Health, readiness, metrics and this document.",
}


def _tag(path: str) -> str:
    return "runs" if path.startswith("/v1/") else "console" if path.startswith("/console") else "operations"


@cache
def document() -> Schema:
    """The OpenAPI document (built once; callers must not change it)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "hermes-bridge-runs",
            "version": "1",
            "description": "A durable job broker in front of Hermes Agent's /v1/runs API. Every error answers the"
            " Hermes envelope (`Error`); `x-error-codes` lists every code with its status.",
        },
        "tags": [{"name": name, "description": what} for name, what in TAGS.items()],
        "paths": {
            path: {method: {**operation, "tags": [_tag(path)]} for method, operation in item.items()}
            for path, item in {
                "/v1/runs": _runs(),
                "/v1/runs/{run_id}": _run(),
                "/v1/runs/{run_id}/events": _events(),
                "/v1/runs/{run_id}/stop": _stop(),
                "/v1/runs/{run_id}/approval": _approval(),
                "/v1/usage": _usage(),
                **_operations(),
            }.items()
        },
        "components": {"schemas": {**s.SCHEMAS, **ready.SCHEMAS, **usage.SCHEMAS}},
        "x-error-codes": {
            code: {"status": status, "description": what} for code, (status, what) in ERROR_CODES.items()
        },
    }


async def serve(request: web.Request) -> web.Response:
    return json_response(document())


def register(app: web.Application) -> None:
    app.router.add_get("/openapi.json", serve)
