"""Pure classification of Hermes answers into the typed outcomes of `models`. No IO."""

from __future__ import annotations

from collections.abc import Mapping

from broker.hermes.models import (
    Accepted,
    Busy,
    CreateOutcome,
    Draining,
    NotFound,
    Rejected,
    Unauthorized,
    Unavailable,
    error_fields,
    parse_json_object,
    parse_retry_after,
)


def create_outcome(status: int, headers: Mapping[str, str], body: bytes) -> CreateOutcome:
    """Classify Hermes's answer to POST /v1/runs."""
    payload = parse_json_object(body)
    if status in (200, 201, 202):
        run_id = payload.get("run_id") if payload else None
        if not isinstance(run_id, str) or not run_id:
            return Unavailable("Hermes accepted the run without a run_id.")
        replayed = payload.get("replayed") is True if payload else False
        return Accepted(run_id, replayed or headers.get("Idempotency-Replayed", "").lower() == "true")
    retry_after = parse_retry_after(headers.get("Retry-After"))
    message, code = error_fields(payload)
    if status == 429:
        return Busy(retry_after, message or "Hermes is at capacity (HTTP 429).")
    if status == 503 and code == "gateway_draining":
        return Draining(retry_after, message or "Hermes is draining (HTTP 503).")
    if status in (401, 403):
        return Unauthorized(status, message or f"Hermes refused the broker's credentials (HTTP {status}).")
    if 400 <= status < 500:
        return Rejected(status, message, code)
    return Unavailable(message or f"Hermes answered HTTP {status}.")


def failure_outcome(status: int, run_id: str) -> NotFound | Unauthorized | Unavailable:
    if status == 404:
        return NotFound(run_id)
    if status in (401, 403):
        return Unauthorized(status, f"Hermes refused the broker's credentials (HTTP {status}).")
    return Unavailable(f"Hermes answered HTTP {status}.")
