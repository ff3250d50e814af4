"""The broker's error tree (one root, HTTP-facing leaves carry their envelope fields) and every code the envelope may
carry (`ERROR_CODES`, which the OpenAPI document lists)."""

from __future__ import annotations

import errno

#: Every code of the error envelope: code -> (HTTP status, when it is answered).
ERROR_CODES: dict[str, tuple[int, str]] = {
    "invalid_json": (400, "The body is not JSON, or not a JSON object."),
    "missing_input": (400, "`input` is absent, null, empty, whitespace-only or []."),
    "invalid_input": (
        400,
        "`input` has another wrong shape (a number, an object, a message without role or content,"
        " an empty last message).",
    ),
    "invalid_field": (400, "A field or query parameter has the wrong type or value; `param` names it."),
    "invalid_context": (400, "`context` breaks a rule of S3.1.2; the message names the path."),
    "invalid_reporting": (400, "`reporting` is not an object of booleans."),
    "invalid_scheduling": (400, "`scheduling` breaks a rule of S4.2; the message names the path."),
    "invalid_callback": (400, '`callback` is not `{"url": …}` with an http(s) URL of an allowed host (S5.8).'),
    "invalid_idempotency_key": (400, "Idempotency-Key is not 1-255 visible ASCII characters."),
    "invalid_session_key": (400, "X-Hermes-Session-Key is over 256 characters, not UTF-8 or has control characters."),
    "invalid_last_event_id": (400, "Last-Event-ID or `after` is not an event id (`<ms>-<seq>`)."),
    "invalid_approval_choice": (400, "`choice` is not once, session, always or deny (or an alias)."),
    "approval_choice_not_allowed": (400, "`always` while RUNS_APPROVAL_ALLOW_ALWAYS is off."),
    "bad_request": (400, "The request is not HTTP the server can parse."),
    "cross_site_request": (403, "A browser marked a create, stop or approval as cross-site."),
    "run_not_found": (404, "No job (and, with RUNS_PROXY_ENABLED, no Hermes run) has this id."),
    "not_found": (404, "No route has this path."),
    "method_not_allowed": (405, "The route does not take this method; `Allow` lists those it takes."),
    "idempotency_key_conflict": (409, "The Idempotency-Key was used with another input or instructions."),
    "session_busy": (409, "multitask `reject` and an earlier turn of the session is queued or live."),
    "approval_not_active": (409, "The job has no live Hermes run to approve."),
    "approval_not_pending": (409, "Hermes's answer: the run waits for no approval."),
    "body_too_large": (413, "The body is over 10 MB, or the execution body over HERMES_MAX_BODY."),
    "uri_too_long": (414, "The request line is over 8190 bytes."),
    "unsupported_media_type": (415, "The body's Content-Type is not one the route reads."),
    "queue_full": (
        429,
        "The key's `waiting` quota or ADMISSION_MAX_WAITING is reached (S4.4); retry after Retry-After.",
    ),
    "header_too_large": (431, "A header field is over 8190 bytes, or there are more than 128."),
    "internal_error": (500, "A bug: the broker failed to answer (logged with its traceback)."),
    "bad_gateway": (502, "A proxied Hermes run's answer was not JSON."),
    "unavailable": (
        503,
        "Redis (or Hermes, for a proxied run or an approval) did not answer; retry after Retry-After.",
    ),
    "busy": (503, "The job kept changing under the request; retry after Retry-After."),
}


class BrokerError(Exception):
    """Raised when anything the broker does fails in a way it knows about."""

    status: int = 500
    type: str = "server_error"
    code: str | None = "internal_error"
    retry_after_s: int | None = None  #: the answer's Retry-After, when the same request may succeed later

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(BrokerError):
    """Raised when a request is malformed; `code` names the rule it broke."""

    status = 400
    type = "invalid_request_error"

    def __init__(self, code: str, message: str, *, param: str | None = None) -> None:
        super().__init__(message, param=param)
        self.code = code


class BodyTooLarge(BrokerError):
    """Raised when a create's execution body is larger than Hermes is configured to take (HERMES_MAX_BODY)."""

    status = 413
    type = "invalid_request_error"
    code = "body_too_large"

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"The body sent to Hermes would be {size} bytes, over the limit of {limit} bytes (HERMES_MAX_BODY)"
        )
        self.size = size
        self.limit = limit


class CrossSiteRequest(BrokerError):
    """Raised when a browser marks a state-changing request as sent by another site (SPEC S8)."""

    status = 403
    type = "invalid_request_error"
    code = "cross_site_request"


class JobNotFound(BrokerError):
    """Raised when a run id names no job (unknown or expired)."""

    status = 404
    type = "invalid_request_error"
    code = "run_not_found"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"Run not found: {run_id}")
        self.run_id = run_id


class IdempotencyConflict(BrokerError):
    """Raised when an Idempotency-Key is reused with a different execution fingerprint."""

    status = 409
    type = "invalid_request_error"
    code = "idempotency_key_conflict"

    def __init__(self) -> None:
        super().__init__("Idempotency-Key was already used with a different input or instructions", param=None)


class SessionBusy(BrokerError):
    """Raised when a turn with multitask `reject` finds an earlier turn of its session queued or live (SPEC S4.3)."""

    status = 409
    type = "invalid_request_error"
    code = "session_busy"

    def __init__(self, session_id: str, holder: str) -> None:
        super().__init__(f"Session {session_id} is busy with {holder}", param="session_id")
        self.holder = holder


class QueueFull(BrokerError):
    """Raised when a create finds its fairness key's `waiting` quota or ADMISSION_MAX_WAITING reached (SPEC S4.4);
    nothing is stored."""

    status = 429
    type = "rate_limit_error"
    code = "queue_full"
    retry_after_s = 5  #: room comes back as waiting jobs start their runs

    def __init__(self, scope: str, limit: int, fairness_key: str) -> None:
        if scope == "key":
            message = f"Fairness key {fairness_key!r} has {limit} jobs waiting, its waiting quota; try again later"
            super().__init__(message, param="scheduling.fairness_key")
        else:
            super().__init__(f"The line holds {limit} waiting jobs, ADMISSION_MAX_WAITING; try again later")
        self.scope = scope
        self.limit = limit


class Conflict(BrokerError):
    """Raised when a request is valid but the job is not in a state that allows it."""

    status = 409
    type = "invalid_request_error"

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class Unavailable(BrokerError):
    """Raised when a dependency (Redis, Hermes) does not answer in time; the answer says when to retry."""

    status = 503
    type = "server_error"
    code = "unavailable"
    retry_after_s = 1  #: the answer's Retry-After: a failover or a restart takes seconds


class Busy(Unavailable):
    """Raised when a job kept changing under a request's feet and the request gave up."""

    code = "busy"


class RedisNearlyFull(Unavailable):
    """Raised when a create finds Redis past REDIS_MEMORY_HIGH of its maxmemory: new jobs wait, so the accepted ones
    keep room to store their events and finish (SPEC S4.4)."""

    retry_after_s = 5  #: room comes back as jobs expire or an operator raises maxmemory: not within a second

    def __init__(self) -> None:
        super().__init__("Redis is nearly full; try again later")


class NotReplicated(Unavailable):
    """Raised when fewer Redis replicas than REDIS_WAIT_REPLICAS confirmed a write in time (SPEC S9).

    The write may stand on the master: a create retried with its Idempotency-Key replays it."""

    def __init__(self, acknowledged: int, wanted: int) -> None:
        super().__init__("The job was not replicated in time; retry with the same Idempotency-Key")
        self.acknowledged = acknowledged
        self.wanted = wanted


class StreamConflict(BrokerError):
    """Raised when an append expected another last stream id (another writer was first)."""

    def __init__(self, job_id: str, actual_last_id: str) -> None:
        super().__init__(f"job {job_id} moved on to {actual_last_id}")
        self.job_id = job_id
        self.actual_last_id = actual_last_id


class LeaseLost(BrokerError):
    """Raised when a fenced append finds that the writer no longer holds the job's lease."""

    def __init__(self, job_id: str) -> None:
        super().__init__(f"lease of job {job_id} is lost")
        self.job_id = job_id


class ConfigError(BrokerError):
    """Raised when an environment variable is missing or does not parse."""


class LegacyLayout(BrokerError):
    """Raised at startup when the store holds keys of the layout before partitions (SPEC S9)."""

    def __init__(self, found: list[str], command: str) -> None:
        super().__init__(
            f"Redis holds jobs of the key layout before partitions ({', '.join(found)}): stop every broker and run"
            f" `{command}` once, then start again"
        )
        self.found = found


class CannotListen(BrokerError):
    """Raised when the broker cannot listen on HOST:PORT (the port is taken, or the address is not ours)."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        if error.errno == errno.EADDRINUSE:
            message = f"PORT {port} is already in use on {host}"
        else:
            message = f"Cannot listen on {host}:{port}: {error.strerror or error}"
        super().__init__(message)
        self.host = host
        self.port = port
