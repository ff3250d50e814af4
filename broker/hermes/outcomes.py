"""Pure classification of Hermes answers into the typed outcomes of `models`. No IO."""

from __future__ import annotations

import re
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
        return Rejected(status, message or answer_text(status, body), code)
    return Unavailable(message or f"Hermes answered HTTP {status}.")


#: How much of an answer that is not Hermes's envelope a job's error keeps: enough for any error page's sentence.
MAX_ANSWER_TEXT = 500
_TAG = re.compile(r"<[^>]*>")
_SPACE = re.compile(r"\s+")


def answer_text(status: int, body: bytes) -> str:
    """What an error answer without Hermes's message says (aiohttp's plain text, a proxy's HTML page, an envelope
    with an empty message): its status and its text, markup and runs of whitespace collapsed, at most
    MAX_ANSWER_TEXT characters. Never empty."""
    text = body.decode("utf-8", "replace")
    if text.lstrip().startswith("<"):
        text = _TAG.sub(" ", text)
    text = _SPACE.sub(" ", text).strip()
    if not text:
        return f"Hermes answered HTTP {status} without a body."
    if len(text) > MAX_ANSWER_TEXT:
        text = text[: MAX_ANSWER_TEXT - 1].rstrip() + "…"
    return f"Hermes answered HTTP {status}: {text}"


def failure_outcome(status: int, run_id: str) -> NotFound | Unauthorized | Unavailable:
    if status == 404:
        return NotFound(run_id)
    if status in (401, 403):
        return Unauthorized(status, f"Hermes refused the broker's credentials (HTTP {status}).")
    return Unavailable(f"Hermes answered HTTP {status}.")
