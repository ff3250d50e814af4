"""Typed outcomes of Hermes `/v1/runs` calls and their structuring from wire payloads. No IO."""

from __future__ import annotations

from typing import TypeAlias

import orjson
from attrs import field, frozen

JsonObject: TypeAlias = dict[str, object]

#: Event names after which Hermes writes `: stream closed` and ends the stream (`run.interrupted` is upstream main).
TERMINAL_EVENTS = frozenset({"run.completed", "run.failed", "run.cancelled", "run.interrupted"})
#: Run statuses that never change again.
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "interrupted"})


@frozen
class Accepted:
    """Hermes accepted a create (202); `replayed` is true when upstream-main idempotency answered it."""

    run_id: str
    replayed: bool = False


@frozen
class Busy:
    """Hermes is at its concurrency cap (429); nothing was started. `message`: Hermes's own words."""

    retry_after_s: float | None
    message: str = field(default="", eq=False)  #: for hold.detail; not part of the outcome's identity


@frozen
class Draining:
    """Hermes is shutting down (503 `gateway_draining`); nothing was started."""

    retry_after_s: float | None
    message: str = field(default="", eq=False)  #: for hold.detail; not part of the outcome's identity


@frozen
class Unavailable:
    """Hermes did not answer usefully: refused, reset, timed out, 5xx or garbage; `reason` is a sentence."""

    reason: str
    #: the request may have reached Hermes and its answer was lost (a timeout, a reset connection): a create may
    #: have started a run there (SPEC S10: the attempt stays bound to that upstream)
    unanswered: bool = field(default=False, eq=False)


@frozen
class Unauthorized:
    """Hermes refused our key (401/403)."""

    status: int
    message: str = field(default="", eq=False)  #: for hold.detail; not part of the outcome's identity


@frozen
class Rejected:
    """Hermes refused the request itself (400 and other 4xx, e.g. 409 `idempotency_key_conflict`)."""

    status: int
    message: str
    code: str | None


@frozen
class NotFound:
    """Hermes does not know the run (404 `run_not_found`): unknown, expired, consumed or lost in a restart."""

    run_id: str


@frozen
class Stopping:
    """Hermes acknowledged a stop (200); `status` is what it answered (`stopping`, or a terminal status upstream)."""

    run_id: str
    status: str


@frozen
class Relayed:
    """Hermes's answer to an approval, status and JSON body unchanged (200 or its error envelope)."""

    status: int
    payload: JsonObject


@frozen
class Forwarded:
    """A proxied Hermes answer: status, the headers worth relaying, and the body bytes."""

    status: int
    headers: dict[str, str]
    body: bytes


@frozen
class HermesRun:
    """The run object of GET /v1/runs/{id}; `raw` keeps the whole payload so unknown fields pass through."""

    run_id: str
    status: str
    created_at: float | None
    updated_at: float | None
    session_id: str | None
    model: str | None
    last_event: str | None
    output: str | None
    usage: JsonObject | None
    error: str | None
    raw: JsonObject

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @classmethod
    def from_api(cls, payload: JsonObject) -> HermesRun:
        usage = payload.get("usage")
        return cls(
            run_id=_text(payload.get("run_id")) or "",
            status=_text(payload.get("status")) or "",
            created_at=_number(payload.get("created_at")),
            updated_at=_number(payload.get("updated_at")),
            session_id=_text(payload.get("session_id")),
            model=_text(payload.get("model")),
            last_event=_text(payload.get("last_event")),
            output=_text(payload.get("output")),
            usage=usage if isinstance(usage, dict) else None,
            error=_text(payload.get("error")),
            raw=payload,
        )


@frozen
class HermesEvent:
    """One `data:` frame of a run's event stream; `payload` is the JSON exactly as received."""

    name: str
    payload: JsonObject

    @property
    def terminal(self) -> bool:
        return self.name in TERMINAL_EVENTS


@frozen
class Comment:
    """An SSE comment line such as `keepalive` or `stream closed` (text without the leading colon)."""

    text: str


@frozen
class StreamEnded:
    """The last item of every opened stream; `clean` means Hermes closed it after a terminal event."""

    clean: bool


CreateOutcome: TypeAlias = Accepted | Busy | Draining | Unavailable | Unauthorized | Rejected
GetOutcome: TypeAlias = HermesRun | NotFound | Unavailable | Unauthorized
StopOutcome: TypeAlias = Stopping | NotFound | Rejected | Unavailable | Unauthorized
ApprovalOutcome: TypeAlias = Relayed | Unavailable | Unauthorized
ForwardOutcome: TypeAlias = Forwarded | Unavailable
StreamItem: TypeAlias = HermesEvent | Comment | StreamEnded | NotFound | Unavailable | Unauthorized


def parse_json_object(body: bytes) -> JsonObject | None:
    """The body as a JSON object, or None when it is not one (HTML error pages, plain text, arrays)."""
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def error_fields(payload: JsonObject | None) -> tuple[str, str | None]:
    """`(message, code)` of a Hermes error envelope; tolerant of missing or odd fields."""
    error = payload.get("error") if payload else None
    if not isinstance(error, dict):
        return "", None
    return _text(error.get("message")) or "", _text(error.get("code"))


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header; HTTP dates and junk give None."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
