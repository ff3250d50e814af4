"""The OpenAPI schemas of the operations routes' answers: /healthz and /readyz (with the admission line and each
upstream's state, as `broker/http/health.py` reports them)."""

from __future__ import annotations

from broker.http.openapi_schemas import SECONDS, Schema, nullable, obj, ref

HEALTH = obj({"status": {"type": "string", "const": "ok"}}, ["status"])
UPSTREAM = obj(
    {
        "name": {"type": "string"},
        "condition": {"type": "string", "enum": ["up", "busy", "refusing", "unreachable", "lost"]},
        "live": {"type": "integer"},
        "limit": {"type": "integer"},
        "learnt": {"type": "boolean"},
        "refusing": {"type": "boolean"},
        "reason": nullable({"type": "string"}),
        "detail": nullable({"type": "string"}),
        "retry_at": nullable(SECONDS),
        "lost": {"type": "boolean"},
        "unreachable_since": nullable(SECONDS),
    },
    [
        "name",
        "condition",
        "live",
        "limit",
        "learnt",
        "refusing",
        "reason",
        "detail",
        "retry_at",
        "lost",
        "unreachable_since",
    ],
)
ADMISSION = obj(
    {
        "live": {"type": "integer"},
        "limit": {"type": "integer"},
        "learnt": {"type": "boolean"},
        "refusing": {"type": "boolean"},
        "reason": nullable({"type": "string"}),
        "detail": nullable({"type": "string"}),
        "retry_at": nullable(SECONDS),
        "line": {"type": "integer", "description": "Jobs waiting in the admission line."},
        "oldest_wait_ms": nullable({"type": "integer"}),
        "probes": {"type": "integer"},
        "refused": {"type": "integer"},
        "waiting_by_priority": {"type": "object", "additionalProperties": {"type": "integer"}},
        "waiting_ahead": {"type": "integer"},
        "session_waiting": {"type": "integer"},
        "top_keys": {
            "type": "array",
            "items": obj(
                {"key": {"type": "string"}, "waiting": {"type": "integer"}, "weight": {"type": "number"}},
                ["key", "waiting", "weight"],
            ),
        },
        "upstreams": {"type": "array", "items": ref("Upstream")},
        "quotas": {
            "type": "array",
            "description": "Each key's use of its ADMISSION_QUOTAS (SPEC S4.4): the keys named there, those holding "
            "jobs and those with most waiting jobs, nearest their limits first. Absent without live or token quotas.",
            "items": obj(
                {
                    "key": {"type": "string"},
                    "live": {"type": "integer", "description": "Its live Hermes runs."},
                    "live_quota": nullable({"type": "integer"}),
                    "waiting": {"type": "integer", "description": "Its jobs waiting: in the line and held."},
                    "waiting_quota": nullable({"type": "integer"}),
                    "held": {"type": "integer", "description": "Its jobs held out of the line by its quota or budget."},
                    "held_for": nullable({"type": "string", "enum": ["quota", "budget"]}),
                    "tokens_used": nullable({"type": "integer", "description": "Tokens its runs used in the window."}),
                    "tokens_quota": nullable({"type": "integer"}),
                    "window": nullable({"type": "string", "enum": ["1h", "1d", "7d"]}),
                    "retry_at": nullable(SECONDS),
                },
                ["key", "live", "live_quota", "waiting", "held", "held_for"],
            ),
        },
    },
    ["live", "limit", "learnt", "refusing", "line", "upstreams"],
)
READY = obj(
    {
        "status": {"type": "string", "enum": ["ready", "not_ready"]},
        "redis": {"type": "boolean"},
        "draining": {"type": "boolean"},
        "hermes_answered": nullable({"type": "boolean", "description": "Whether Hermes answered the last call."}),
        "reason": {"type": "string", "description": "Why the replica is not ready."},
        "queue_depth": {"type": "integer"},
        "oldest_queued_age_ms": nullable({"type": "integer"}),
        "scheduled_jobs": {"type": "integer"},
        "admission": ref("Admission"),
        "cluster": {"type": "object", "description": "The Redis Cluster's state (REDIS_CLUSTER=true)."},
    },
    ["status", "redis", "draining"],
)

SCHEMAS: dict[str, Schema] = {"Health": HEALTH, "Ready": READY, "Admission": ADMISSION, "Upstream": UPSTREAM}
