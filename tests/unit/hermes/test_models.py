"""Classifying Hermes answers into typed outcomes, and structuring the run object."""

from __future__ import annotations

import orjson

from broker.hermes.models import (
    Accepted,
    Busy,
    Draining,
    HermesRun,
    Rejected,
    Unauthorized,
    Unavailable,
    parse_retry_after,
)
from broker.hermes.outcomes import create_outcome

RUN = (
    b'{"object": "hermes.run", "run_id": "run_c6", "status": "completed", "updated_at": 1796005750.86,'
    b' "created_at": 1796005747.39, "session_id": "run_c6", "model": "hermes-agent", "last_event": "run.completed",'
    b' "output": "Hello", "usage": {"input_tokens": 11, "output_tokens": 7, "total_tokens": 18}, "approval": {}}'
)


def envelope(message: str, code: str | None) -> bytes:
    return f'{{"error": {{"message": "{message}", "type": "invalid_request_error", "param": null, "code": '.encode() + (
        f'"{code}"}}}}'.encode() if code else b"null}}"
    )


def test_create_answers_map_to_outcomes() -> None:
    assert create_outcome(202, {}, b'{"run_id": "run_1", "status": "started"}') == Accepted("run_1")
    assert create_outcome(202, {}, b'{"run_id": "run_1", "status": "running", "replayed": true}') == Accepted(
        "run_1", replayed=True
    )
    assert create_outcome(202, {"Idempotency-Replayed": "true"}, b'{"run_id": "run_1"}') == Accepted("run_1", True)
    assert create_outcome(429, {"Retry-After": "1"}, envelope("Too many", "rate_limit_exceeded")) == Busy(1.0)
    assert create_outcome(503, {"Retry-After": "1"}, envelope("Draining", "gateway_draining")) == Draining(1.0)
    assert create_outcome(503, {}, b"<html>bad gateway</html>") == Unavailable("Hermes answered HTTP 503.")
    assert create_outcome(500, {}, b"500 Internal Server Error") == Unavailable("Hermes answered HTTP 500.")
    assert create_outcome(401, {}, envelope("Invalid API key", "invalid_api_key")) == Unauthorized(401)
    assert create_outcome(403, {}, envelope("needs a key", None)) == Unauthorized(403)
    assert create_outcome(400, {}, envelope("Invalid JSON", None)) == Rejected(400, "Invalid JSON", None)
    assert create_outcome(409, {}, envelope("used", "idempotency_key_conflict")) == Rejected(
        409, "used", "idempotency_key_conflict"
    )
    assert create_outcome(429, {}, envelope("Too many", "rate_limit_exceeded")).message == "Too many"
    assert create_outcome(403, {}, envelope("needs a key", None)).message == "needs a key"  # type: ignore[union-attr]
    assert create_outcome(429, {}, b"").message == "Hermes is at capacity (HTTP 429)."  # type: ignore[union-attr]
    assert create_outcome(202, {}, b"garbage") == Unavailable("Hermes accepted the run without a run_id.")


def test_retry_after_accepts_seconds_only() -> None:
    assert [parse_retry_after(v) for v in ("1", " 2.5 ", "-1", "Wed, 21 Oct 2015 07:28:00 GMT", None)] == [
        1.0,
        2.5,
        None,
        None,
        None,
    ]


def test_the_run_object_keeps_unknown_fields_in_raw() -> None:
    run = HermesRun.from_api(orjson.loads(RUN))
    assert (run.run_id, run.status, run.output, run.last_event, run.error) == (
        "run_c6",
        "completed",
        "Hello",
        "run.completed",
        None,
    )
    assert run.usage == {"input_tokens": 11, "output_tokens": 7, "total_tokens": 18}
    assert run.created_at == 1796005747.39 and run.terminal
    assert run.raw["approval"] == {}


#: What aiohttp answers when a body passes its `client_max_size` and the handler lets it escape (text/plain).
AIOHTTP_413 = b"Maximum request body size 1048576 exceeded, actual body size 2097152"
NGINX_413 = (
    b"<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n"
    b"<center><h1>413 Request Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)


def test_a_rejection_without_the_envelope_carries_the_status_and_the_answers_text() -> None:
    assert create_outcome(413, {}, AIOHTTP_413) == Rejected(
        413, f"Hermes answered HTTP 413: {AIOHTTP_413.decode()}", None
    )
    assert create_outcome(413, {}, NGINX_413) == Rejected(
        413, "Hermes answered HTTP 413: 413 Request Entity Too Large 413 Request Entity Too Large nginx", None
    )
    assert create_outcome(404, {}, b"404: Not Found\n") == Rejected(
        404, "Hermes answered HTTP 404: 404: Not Found", None
    )
    assert create_outcome(400, {}, b"") == Rejected(400, "Hermes answered HTTP 400 without a body.", None)
    assert create_outcome(400, {}, b"  \n\t ") == Rejected(400, "Hermes answered HTTP 400 without a body.", None)


def test_an_envelope_with_an_empty_message_carries_the_answers_text() -> None:
    blank = envelope("", "odd")
    assert create_outcome(400, {}, blank) == Rejected(400, f"Hermes answered HTTP 400: {blank.decode()}", "odd")


def test_a_long_answer_is_trimmed_to_500_characters_of_text() -> None:
    outcome = create_outcome(400, {}, b"\xff" + b"e" * 10_000)  # not even UTF-8
    assert isinstance(outcome, Rejected)
    text = outcome.message.removeprefix("Hermes answered HTTP 400: ")
    assert len(text) == 500 and text.endswith("…") and text.startswith("\ufffdeee")
