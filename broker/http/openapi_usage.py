"""The OpenAPI schemas and parameters of GET /v1/usage (SPEC S4.5): one fairness key's buckets, or the top keys."""

from __future__ import annotations

from broker.http.openapi_schemas import Schema, obj, ref
from broker.http.usage import DEFAULT_LIMIT, MAX_KEY_LENGTH, MAX_LIMIT

_COUNTS: dict[str, Schema] = {
    "runs_started": {"type": "integer", "minimum": 0, "description": "Runs Hermes accepted."},
    "runs_completed": {"type": "integer", "minimum": 0},
    "runs_failed": {"type": "integer", "minimum": 0},
    "runs_cancelled": {"type": "integer", "minimum": 0},
    "hermes_seconds": {
        "type": "number",
        "minimum": 0,
        "description": "Slot time: from the create Hermes accepted to the run's settling.",
    },
    "input_tokens": {"type": "integer", "minimum": 0},
    "output_tokens": {"type": "integer", "minimum": 0},
    "total_tokens": {"type": "integer", "minimum": 0},
}
BUCKET = obj(
    {"start": {"type": "integer", "description": "The bucket's start, epoch seconds (UTC)."}, **_COUNTS},
    ["start", *_COUNTS],
)
KEY_TOTALS = obj({"key": {"type": "string"}, **_COUNTS}, ["key", *_COUNTS])
KEY_USAGE = obj(
    {
        "object": {"type": "string", "const": "usage"},
        "key": {"type": "string"},
        "data": {"type": "array", "items": ref("UsageBucket")},
    },
    ["object", "key", "data"],
)
TOP_USAGE = obj(
    {"object": {"type": "string", "const": "usage"}, "data": {"type": "array", "items": ref("UsageKeyTotals")}},
    ["object", "data"],
)
SCHEMAS: dict[str, Schema] = {
    "UsageBucket": BUCKET,
    "UsageKeyTotals": KEY_TOTALS,
    "KeyUsage": KEY_USAGE,
    "TopUsage": TOP_USAGE,
}

_TIME = {"type": "number", "minimum": 0}
PARAMETERS: list[Schema] = [
    {
        "name": "key",
        "in": "query",
        "schema": {"type": "string", "maxLength": MAX_KEY_LENGTH},
        "description": "A fairness key (empty: the jobs without one). Absent: the keys with most Hermes seconds.",
    },
    {"name": "since", "in": "query", "schema": _TIME, "description": "Epoch seconds (default: 24 hours before until)."},
    {"name": "until", "in": "query", "schema": _TIME, "description": "Epoch seconds (default: now)."},
    {"name": "bucket", "in": "query", "schema": {"type": "string", "enum": ["hour", "day"], "default": "hour"}},
    {
        "name": "limit",
        "in": "query",
        "schema": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
        "description": "Most keys answered without `key`.",
    },
]
#: anyOf: a key's answer fits both (no shape forbids more fields)
ANSWER: Schema = {"anyOf": [ref("KeyUsage"), ref("TopUsage")]}
