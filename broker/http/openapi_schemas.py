"""The OpenAPI document's schemas (`components.schemas`) of the runs: request bodies, the job object, events, the
error envelope (those of the operations routes are in `openapi_ready.py`).

Every object lists its `required` fields, so an answer is held to its shape; none forbids extra fields, so a client
keeps working when a field is added. To add a field to the job object, add it to `JOB_PROPERTIES` (and to
`JOB_REQUIRED` when every job object has it); a field of the create body goes into `CREATE_PROPERTIES`.
"""

from __future__ import annotations

from typing import Any

from broker.admission.fair import PRIORITIES
from broker.config import MULTITASK
from broker.config_values import MAX_FAIRNESS_WEIGHT
from broker.events import HoldReason, JobStatus
from broker.http import schemas as limits
from broker.http.schemas import APPROVAL_CHOICES

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def nullable(schema: Schema) -> Schema:
    """`schema` or null (OpenAPI 3.1 is JSON Schema: no `nullable` keyword)."""
    if "$ref" in schema:
        return {"oneOf": [schema, {"type": "null"}]}
    if "enum" in schema:
        return {**schema, "type": [schema["type"], "null"], "enum": [*schema["enum"], None]}
    return {**schema, "type": [schema["type"], "null"]}


def obj(properties: dict[str, Schema], required: list[str] | None = None, **extra: Any) -> Schema:
    schema: Schema = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = required
    return schema


SECONDS = {"type": "number", "description": "Epoch seconds (float), as Hermes."}
#: Not blank: a character that neither JSON Schema's `\s` nor Python's str.strip() counts as white space.
NOT_BLANK = r"[^\s\x1c-\x1f\x85]"
URL = {
    "type": "string",
    "maxLength": limits.MAX_URL,
    # the scheme (any case), a host (RFC 3986: anything up to the port, path, query or fragment), no user info
    "pattern": r"^[hH][tT][tT][pP][sS]?://[^/?#@:\x00-\x20\x7f][^/?#@\x00-\x20\x7f]*([/?#][^\x00-\x20\x7f]*)?$",
    "description": "An http or https URL with a host and without user info.",
}

MESSAGE = obj(
    {"role": {"type": "string"}, "content": {"oneOf": [{"type": "string"}, {"type": "array"}]}}, ["role", "content"]
)
#: A message whose content has text: what the last message of an array `input` must be.
USER_MESSAGE = obj(
    {
        "content": {
            "oneOf": [
                {"type": "string", "pattern": NOT_BLANK},
                {"type": "array", "contains": obj({"text": {"type": "string", "pattern": NOT_BLANK}}, ["text"])},
            ]
        }
    },
    ["content"],
)
CONTEXT = obj(
    {
        "title": {"type": "string", "minLength": 1, "maxLength": limits.MAX_TITLE, "pattern": NOT_BLANK},
        "url": URL,
        "links": {
            "type": "array",
            "maxItems": limits.MAX_LINKS,
            "items": obj(
                {
                    "text": {"type": "string", "minLength": 1, "maxLength": limits.MAX_LINK_TEXT, "pattern": NOT_BLANK},
                    "url": URL,
                },
                ["text", "url"],
            ),
        },
    },
    ["title"],
    description="Display only (S3.1.2): stored as given, never sent to Hermes.",
)
REPORTING_REQUEST = obj(
    {"board": {"type": "boolean"}, "post": {"type": "boolean"}},
    description="Reporting visibility (S3.1.3): an omitted flag means true.",
)
SCHEDULING_REQUEST = obj(
    {
        "priority": {"type": "integer", "minimum": PRIORITIES[0], "maximum": PRIORITIES[-1], "default": 3},
        "fairness_key": {
            "type": "string",
            "minLength": 1,
            "maxLength": limits.MAX_FAIRNESS_KEY,
            "pattern": "^[!-~]+$",
        },
        "fairness_weight": {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_FAIRNESS_WEIGHT, "default": 1},
        "multitask": {"type": "string", "enum": list(MULTITASK)},
    },
    description="The job's place in the line (priority, fair share) and what a busy session's new turn does.",
)

#: The create body. Forwarded to Hermes: input, instructions, conversation_history, previous_response_id,
#: session_id, model. Kept by the broker: the rest.
CREATE_PROPERTIES: dict[str, Schema] = {
    "input": {
        "oneOf": [
            {"type": "string", "minLength": 1, "pattern": NOT_BLANK},
            {"type": "array", "minItems": 1, "items": {"allOf": [ref("Message"), ref("UserMessage")]}},
        ],
        "description": "The user message, or messages whose last one is the user message. Its content must have"
        " text; the earlier messages' content is not checked.",
    },
    # null counts as absent for the forwarded fields and session_history
    "instructions": nullable({"type": "string"}),
    "conversation_history": nullable({"type": "array", "items": ref("Message")}),
    "previous_response_id": nullable({"type": "string"}),
    "session_id": nullable({"type": "string", "minLength": 1, "maxLength": limits.MAX_SESSION_KEY_LENGTH}),
    "model": nullable({"type": "string"}),
    "context": ref("Context"),
    "reporting": ref("ReportingRequest"),
    "scheduling": ref("SchedulingRequest"),
    "session_history": nullable({"type": "boolean", "description": "Send the session's earlier turns as history."}),
    "callback": nullable(
        obj(
            {"url": {"type": "string", "minLength": 1, "maxLength": 2048, "description": "http(s), an allowed host."}},
            ["url"],
            description="Where the job's approval requests and its end are POSTed (S5.8; CALLBACK_ALLOWED_HOSTS).",
        )
    ),
}
CREATE = obj(
    CREATE_PROPERTIES,
    ["input"],
    description="Unknown fields are ignored and not stored.",
    # session_history needs a session, a turn that waits its turn, and no history of the caller's own
    dependentSchemas={
        "session_history": {
            "if": {"properties": {"session_history": {"const": True}}},
            "then": {
                "required": ["session_id"],
                "not": {"anyOf": [{"required": ["conversation_history"]}, {"required": ["previous_response_id"]}]},
                "properties": {"scheduling": {"properties": {"multitask": {"const": "enqueue"}}}},
            },
        }
    },
)

HOLD = obj(
    {
        "reason": {"type": "string", "enum": [reason.value for reason in HoldReason]},
        "since": SECONDS,
        "retry_at": SECONDS,
        "detail": {"type": "string"},
    },
    ["reason", "since", "retry_at", "detail"],
    description="Why the job waits while Hermes (or its session) does not take it.",
)
USAGE = obj(
    {"input_tokens": {"type": "integer"}, "output_tokens": {"type": "integer"}, "total_tokens": {"type": "integer"}}
)
JOB_ERROR = obj(
    {
        "code": {
            "type": "string",
            "description": "hermes_failed, hermes_rejected, hold_expired, resubmit_exhausted, approval_denied, stopped,"
            " superseded",
        },
        "message": {"type": "string"},
    },
    ["code", "message"],
)

#: The job object (S3.2), a superset of Hermes's run object.
JOB_PROPERTIES: dict[str, Schema] = {
    "object": {"type": "string", "const": "hermes.run"},
    "run_id": {"type": "string", "pattern": "^job_", "description": "The job id."},
    "status": {"type": "string", "enum": [status.value for status in JobStatus]},
    "created_at": SECONDS,
    "updated_at": SECONDS,
    "session_id": nullable({"type": "string"}),
    "model": {"type": "string"},
    "last_event": nullable({"type": "string"}),
    "attempts": {"type": "integer", "minimum": 0, "description": "Hermes runs of the job."},
    "hermes_run_id": nullable({"type": "string"}),
    "hold": nullable(ref("Hold")),
    "output": nullable({"type": "string"}),
    "usage": nullable(ref("Usage")),
    "error": nullable(ref("JobError")),
    "context": ref("Context"),
    "reporting": obj({"board": {"type": "boolean"}, "post": {"type": "boolean"}}, ["board", "post"]),
    "scheduling": obj(
        {
            "priority": {"type": "integer"},
            "fairness_key": {"type": "string"},
            "fairness_weight": {"type": "number"},
            "multitask": {"type": "string", "enum": list(MULTITASK)},
        },
        ["priority", "fairness_key", "fairness_weight", "multitask"],
    ),
    "upstream": nullable({"type": "string", "description": "The Hermes deployment of the current or last attempt."}),
    "dropped_deltas": {"type": "integer", "description": "message.delta events not stored (RUNS_EVENTS_MAXLEN)."},
    "owner": nullable({"type": "string", "description": "The replica driving the job (null: none does)."}),
    "callback": obj(
        {
            "url": {"type": "string"},
            "status": {"type": "string", "enum": ["pending", "delivered", "failed", "gone"]},
            "attempts": {"type": "integer", "minimum": 0},
            "last_error": nullable({"type": "string"}),
        },
        ["url", "status", "attempts", "last_error"],
        description="A job created with a callback: the state of its deliveries (S5.8).",
    ),
}
JOB_REQUIRED = [
    "object",
    "run_id",
    "status",
    "created_at",
    "updated_at",
    "session_id",
    "model",
    "last_event",
    "attempts",
    "hermes_run_id",
    "hold",
    "output",
    "usage",
    "error",
    "reporting",
    "scheduling",
    "upstream",
    "owner",
]
JOB = obj(JOB_PROPERTIES, JOB_REQUIRED)
#: A Hermes run relayed with RUNS_PROXY_ENABLED (S3.7): Hermes's own object, whose `error` is a string.
HERMES_RUN = obj(
    {
        "object": {"type": "string", "const": "hermes.run"},
        "run_id": {"type": "string", "not": {"pattern": "^job_"}},
        "status": {"type": "string"},
        "created_at": SECONDS,
        "updated_at": SECONDS,
        "session_id": {"type": "string"},
        "model": {"type": "string"},
        "last_event": {"type": "string"},
        "output": {"type": "string"},
        "usage": ref("Usage"),
        "error": {"type": "string"},
    },
    ["object", "run_id", "status", "created_at", "updated_at"],
)
CREATED = {
    "allOf": [
        ref("Job"),
        obj(
            {"replayed": {"type": "boolean", "description": "True when an Idempotency-Key replayed a job."}},
            ["replayed"],
        ),
    ]
}
JOB_LIST = obj(
    {
        "object": {"type": "string", "const": "list"},
        "data": {"type": "array", "items": ref("Job")},
        "next_cursor": nullable({"type": "string"}),
    },
    ["object", "data", "next_cursor"],
)
STOPPED = obj(
    {"run_id": {"type": "string"}, "status": {"type": "string", "enum": [status.value for status in JobStatus]}},
    ["run_id", "status"],
)
APPROVAL = obj(
    {
        "choice": {
            "type": "string",
            "enum": list(APPROVAL_CHOICES),
            "description": "Case-insensitive; approve, approved and allow mean once. `always` only with"
            " RUNS_APPROVAL_ALLOW_ALWAYS.",
        },
        "all": {"description": 'Resolve every pending prompt (true, or "true", "1", "yes", "on").'},
    },
    ["choice"],
)
APPROVAL_ANSWER = obj(
    {
        "object": {"type": "string", "const": "hermes.run.approval_response"},
        "run_id": {"type": "string"},
        "choice": {"type": "string"},
        "resolved": {"type": "integer"},
    },
    ["run_id"],
    description="Hermes's answer, relayed with run_id rewritten to the job id.",
)
EVENT = obj(
    {
        "event": {
            "type": "string",
            "description": "Hermes's events (message.delta, tool.started, tool.completed, reasoning.available,"
            " approval.request, approval.responded, run.completed, run.failed, run.cancelled, and any a newer Hermes"
            " adds) and the broker's (job.queued, job.held, job.accepted, job.interrupted, job.resubmitted,"
            " job.stop_requested, job.rerouted).",
        },
        "run_id": {"type": "string", "description": "The job id."},
        "timestamp": SECONDS,
        "hermes_run_id": {"type": "string"},
        "attempt": {"type": "integer"},
    },
    ["event", "run_id", "timestamp"],
    description="The JSON of one `data:` line of the event stream; its frame's `id:` is the event's position.",
)
ERROR = obj(
    {
        "error": obj(
            {
                "message": {"type": "string"},
                "type": {"type": "string", "description": "invalid_request_error, or server_error for a 5xx."},
                "param": nullable({"type": "string", "description": "The offending field, header or parameter."}),
                "code": nullable(
                    {"type": "string", "description": "One of the error codes listed in `x-error-codes`."}
                ),
            },
            ["message", "type", "param", "code"],
        )
    },
    ["error"],
    description="The Hermes error envelope: every error answer, whatever the route and the input.",
)

SCHEMAS: dict[str, Schema] = {
    "CreateRun": CREATE,
    "Message": MESSAGE,
    "UserMessage": USER_MESSAGE,
    "Context": CONTEXT,
    "ReportingRequest": REPORTING_REQUEST,
    "SchedulingRequest": SCHEDULING_REQUEST,
    "Job": JOB,
    "HermesRun": HERMES_RUN,
    "CreatedJob": CREATED,
    "JobList": JOB_LIST,
    "Hold": HOLD,
    "Usage": USAGE,
    "JobError": JOB_ERROR,
    "Stopped": STOPPED,
    "Approval": APPROVAL,
    "ApprovalAnswer": APPROVAL_ANSWER,
    "Event": EVENT,
    "Error": ERROR,
}
