"""Validation and the error envelope over real HTTP (SPEC S3, S3.1, S3.8): every failure is a
400/404/405/413/414/431 in the Hermes envelope that names the offending field, and stores nothing."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

OK_INPUT = {"input": "hello"}
LINK = {"text": "Pipeline", "url": "https://ci.example/p/1"}


def _with(**fields: Any) -> dict[str, Any]:
    return {**OK_INPUT, **fields}


def _ctx(**fields: Any) -> dict[str, Any]:
    return _with(context={"title": "Review", **fields})


# (case id, raw body bytes, extra headers, SPEC code, text the message must contain)
MATRIX: list[tuple[str, bytes, dict[str, str], str, str]] = [
    ("not-json", b"{input: hello", {}, "invalid_json", "JSON"),
    ("empty-body", b"", {}, "invalid_json", "JSON"),
    ("not-utf8", b"\xff\xfe{}", {}, "invalid_json", "JSON"),
    ("array", b"[1,2]", {}, "invalid_json", "object"),
    ("string", b'"x"', {}, "invalid_json", "object"),
    ("null", b"null", {}, "invalid_json", "object"),
    ("number", b"42", {}, "invalid_json", "object"),
    ("input-absent", b"{}", {}, "missing_input", "input"),
    ("input-null", b'{"input":null}', {}, "missing_input", "input"),
    ("input-empty", b'{"input":""}', {}, "missing_input", "input"),
    ("input-blank", b'{"input":"   "}', {}, "missing_input", "input"),
    ("input-empty-list", b'{"input":[]}', {}, "missing_input", "input"),
    ("input-number", b'{"input":5}', {}, "invalid_input", "input"),
    ("input-object", b'{"input":{"role":"user","content":"x"}}', {}, "invalid_input", "input"),
    ("input-bool", b'{"input":true}', {}, "invalid_input", "input"),
    ("input-no-role", b'{"input":[{"content":"x"}]}', {}, "invalid_input", "input[0]"),
    ("input-no-content", b'{"input":[{"role":"user"}]}', {}, "invalid_input", "input[0]"),
    ("input-not-message", b'{"input":["x"]}', {}, "invalid_input", "input[0]"),
    (
        "input-empty-last",
        b'{"input":[{"role":"user","content":"x"},{"role":"user","content":""}]}',
        {},
        "invalid_input",
        "input[1]",
    ),
    ("instructions-number", orjson.dumps(_with(instructions=1)), {}, "invalid_field", "instructions"),
    ("model-list", orjson.dumps(_with(model=["m"])), {}, "invalid_field", "model"),
    ("previous-bool", orjson.dumps(_with(previous_response_id=True)), {}, "invalid_field", "previous_response_id"),
    ("session-number", orjson.dumps(_with(session_id=7)), {}, "invalid_field", "session_id"),
    ("session-257", orjson.dumps(_with(session_id="s" * 257)), {}, "invalid_field", "session_id"),
    ("session-empty", orjson.dumps(_with(session_id="")), {}, "invalid_field", "session_id"),
    ("history-object", orjson.dumps(_with(conversation_history={})), {}, "invalid_field", "conversation_history"),
    (
        "history-no-role",
        orjson.dumps(_with(conversation_history=[{"role": "user", "content": "a"}, {"content": "b"}])),
        {},
        "invalid_field",
        "conversation_history[1]",
    ),
    ("context-string", orjson.dumps(_with(context="Review")), {}, "invalid_context", "context"),
    ("context-null", orjson.dumps(_with(context=None)), {}, "invalid_context", "context"),
    ("context-no-title", orjson.dumps(_with(context={"url": "https://a.b"})), {}, "invalid_context", "context.title"),
    ("title-blank", orjson.dumps(_ctx(title="   ")), {}, "invalid_context", "context.title"),
    ("title-empty", orjson.dumps(_ctx(title="")), {}, "invalid_context", "context.title"),
    ("title-501", orjson.dumps(_ctx(title="t" * 501)), {}, "invalid_context", "context.title"),
    ("title-number", orjson.dumps(_ctx(title=5)), {}, "invalid_context", "context.title"),
    ("url-ftp", orjson.dumps(_ctx(url="ftp://a.b/c")), {}, "invalid_context", "context.url"),
    ("url-no-host", orjson.dumps(_ctx(url="https:///path")), {}, "invalid_context", "context.url"),
    ("url-relative", orjson.dumps(_ctx(url="/mr/1")), {}, "invalid_context", "context.url"),
    ("url-userinfo", orjson.dumps(_ctx(url="https://user:pass@a.b/c")), {}, "invalid_context", "context.url"),
    ("url-user", orjson.dumps(_ctx(url="https://user@a.b/c")), {}, "invalid_context", "context.url"),
    ("url-2049", orjson.dumps(_ctx(url="https://a.b/" + "x" * 2037)), {}, "invalid_context", "context.url"),
    ("url-number", orjson.dumps(_ctx(url=1)), {}, "invalid_context", "context.url"),
    ("links-object", orjson.dumps(_ctx(links={})), {}, "invalid_context", "context.links"),
    ("links-11", orjson.dumps(_ctx(links=[LINK] * 11)), {}, "invalid_context", "context.links"),
    ("link-string", orjson.dumps(_ctx(links=[LINK, "x"])), {}, "invalid_context", "context.links[1]"),
    (
        "link-text-101",
        orjson.dumps(_ctx(links=[{**LINK, "text": "t" * 101}])),
        {},
        "invalid_context",
        "context.links[0].text",
    ),
    ("link-text-blank", orjson.dumps(_ctx(links=[{**LINK, "text": " "}])), {}, "invalid_context", "links[0].text"),
    ("link-no-url", orjson.dumps(_ctx(links=[{"text": "a"}])), {}, "invalid_context", "context.links[0].url"),
    (
        "link-url-ftp",
        orjson.dumps(_ctx(links=[LINK, LINK, {**LINK, "url": "ftp://a.b"}])),
        {},
        "invalid_context",
        "context.links[2].url must be an http or https URL",
    ),
    ("reporting-string", orjson.dumps(_with(reporting={"board": "false"})), {}, "invalid_reporting", "reporting.board"),
    ("reporting-zero", orjson.dumps(_with(reporting={"post": 0})), {}, "invalid_reporting", "reporting.post"),
    ("reporting-flag-null", orjson.dumps(_with(reporting={"board": None})), {}, "invalid_reporting", "reporting.board"),
    ("reporting-null", orjson.dumps(_with(reporting=None)), {}, "invalid_reporting", "reporting"),
    ("reporting-list", orjson.dumps(_with(reporting=[True])), {}, "invalid_reporting", "reporting"),
    ("reporting-bool", orjson.dumps(_with(reporting=False)), {}, "invalid_reporting", "reporting"),
    ("key-empty", orjson.dumps(OK_INPUT), {"Idempotency-Key": ""}, "invalid_idempotency_key", "Idempotency-Key"),
    ("key-space", orjson.dumps(OK_INPUT), {"Idempotency-Key": "a b"}, "invalid_idempotency_key", "Idempotency-Key"),
    ("key-256", orjson.dumps(OK_INPUT), {"Idempotency-Key": "k" * 256}, "invalid_idempotency_key", "Idempotency-Key"),
    ("key-tab", orjson.dumps(OK_INPUT), {"Idempotency-Key": "a\tb"}, "invalid_idempotency_key", "Idempotency-Key"),
    *(
        (f"scheduling-{name}", orjson.dumps(_with(scheduling=value)), {}, "invalid_scheduling", message)
        for name, value, message in [
            ("null", None, "scheduling must be an object"),
            ("list", [], "scheduling must be an object"),
            ("string", "high", "scheduling must be an object"),
            ("priority-0", {"priority": 0}, "scheduling.priority must be an integer from 1 to 5"),
            ("priority-6", {"priority": 6}, "scheduling.priority must be an integer from 1 to 5"),
            ("priority-float", {"priority": 2.0}, "scheduling.priority must be an integer from 1 to 5"),
            ("priority-string", {"priority": "1"}, "scheduling.priority must be an integer from 1 to 5"),
            ("priority-bool", {"priority": True}, "scheduling.priority must be an integer from 1 to 5"),
            ("priority-null", {"priority": None}, "scheduling.priority must be an integer from 1 to 5"),
            ("key-empty", {"fairness_key": ""}, "scheduling.fairness_key must be 1-64 visible ASCII characters"),
            ("key-65", {"fairness_key": "k" * 65}, "scheduling.fairness_key must be 1-64 visible ASCII characters"),
            ("key-space", {"fairness_key": "a b"}, "scheduling.fairness_key must be 1-64 visible ASCII characters"),
            ("key-utf8", {"fairness_key": "é"}, "scheduling.fairness_key must be 1-64 visible ASCII characters"),
            ("key-number", {"fairness_key": 7}, "scheduling.fairness_key must be 1-64 visible ASCII characters"),
            ("key-null", {"fairness_key": None}, "scheduling.fairness_key must be 1-64 visible ASCII characters"),
            ("weight-0", {"fairness_weight": 0}, "scheduling.fairness_weight must be a number greater than 0"),
            ("weight-negative", {"fairness_weight": -1}, "scheduling.fairness_weight must be a number greater than 0"),
            ("weight-1001", {"fairness_weight": 1000.5}, "scheduling.fairness_weight must be a number greater than 0"),
            ("weight-string", {"fairness_weight": "2"}, "scheduling.fairness_weight must be a number greater than 0"),
            ("weight-bool", {"fairness_weight": True}, "scheduling.fairness_weight must be a number greater than 0"),
            ("weight-null", {"fairness_weight": None}, "scheduling.fairness_weight must be a number greater than 0"),
        ]
    ),
    (
        "session-key-257",
        orjson.dumps(OK_INPUT),
        {"X-Hermes-Session-Key": "s" * 257},
        "invalid_session_key",
        "X-Hermes-Session-Key",
    ),
    (
        "session-key-tab",
        orjson.dumps(OK_INPUT),
        {"X-Hermes-Session-Key": "a\tb"},
        "invalid_session_key",
        "X-Hermes-Session-Key",
    ),
]


def assert_envelope(document: Any, code: str | None) -> dict[str, Any]:
    assert isinstance(document, dict) and set(document) == {"error"}, document
    error = document["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"]
    assert not error["message"].endswith("."), error  # Hermes's style, and SPEC S3.1's examples: no full stop
    assert isinstance(error["type"], str) and error["type"]
    assert error["param"] is None or isinstance(error["param"], str)
    assert error["code"] == code
    return dict(error)


async def _job_keys(redis: Redis) -> list[str]:
    return [key async for key in redis.scan_iter(match="hbr:{p*}:job_*")]


async def _raw_post(client: TestClient[Any, Any], header: bytes, body: bytes) -> tuple[int, bytes, bytes]:
    """POST /v1/runs with a header line aiohttp's client would refuse to send."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(
        b"POST /v1/runs HTTP/1.1\r\nHost: broker\r\nConnection: close\r\nContent-Type: application/json\r\n"
        + header
        + b"\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body
    )
    await writer.drain()
    try:
        answer = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), head, payload


@pytest.mark.parametrize(("raw", "headers", "code", "names"), [case[1:] for case in MATRIX], ids=[c[0] for c in MATRIX])
async def test_a_bad_create_answers_400_and_stores_nothing(
    client: TestClient[Any, Any], redis: Redis, raw: bytes, headers: dict[str, str], code: str, names: str
) -> None:
    # Given a running broker and the keys it holds before the request
    before = await redis.dbsize()
    headers = {"Content-Type": "application/json", **headers}
    # When a bad create arrives
    answer = await client.post("/v1/runs", data=raw, headers=headers)
    # Then it is a 400 in the envelope, naming the field, and nothing was stored
    assert answer.status == 400
    assert answer.content_type == "application/json"
    error = assert_envelope(await answer.json(), code)
    assert error["type"] == "invalid_request_error"
    assert names in error["message"]
    assert await redis.dbsize() == before
    assert await _job_keys(redis) == []


async def test_the_matrix_is_big_enough() -> None:
    assert len(MATRIX) >= 30
    assert {case[3] for case in MATRIX} == {
        "invalid_json",
        "missing_input",
        "invalid_input",
        "invalid_field",
        "invalid_context",
        "invalid_reporting",
        "invalid_scheduling",
        "invalid_idempotency_key",
        "invalid_session_key",
    }


@pytest.mark.parametrize(
    ("header", "code"),
    [
        (b"Idempotency-Key: \xc3\xa9t\xc3\xa9", "invalid_idempotency_key"),
        (b"Idempotency-Key: a b", "invalid_idempotency_key"),
        (b"X-Hermes-Session-Key: a\tb", "invalid_session_key"),
        # aiohttp's parser rejects this before any route sees it: still the envelope, code bad_request.
        (b"X-Hermes-Session-Key: a\x01b", "bad_request"),
    ],
    ids=["key-non-ascii", "key-space", "session-key-tab", "session-key-control-char"],
)
async def test_bad_header_bytes_answer_the_envelope(
    client: TestClient[Any, Any], redis: Redis, header: bytes, code: str
) -> None:
    before = await redis.dbsize()
    status, head, payload = await _raw_post(client, header, orjson.dumps(OK_INPUT))
    assert status == 400
    assert b"application/json" in head.lower()
    assert_envelope(orjson.loads(payload), code)
    assert await redis.dbsize() == before


async def _raw(client: TestClient[Any, Any], request: bytes) -> tuple[int, bytes, dict[str, Any]]:
    """Send `request` as is over a fresh connection; the status, head and JSON body of the answer."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(request)
    await writer.drain()
    try:
        answer = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), head, orjson.loads(payload)


LIMIT = 8190  # aiohttp's max_line_size and max_field_size


@pytest.mark.parametrize(
    ("request_bytes", "status", "code", "message"),
    [
        (b"GET /v1/runs/" + b"j" * 9000 + b" HTTP/1.1\r\nHost: b\r\n\r\n", 414, "uri_too_long",
         f"Request URI exceeds {LIMIT} bytes"),
        (b"GET /v1/runs?after=" + b"1" * (LIMIT + 1) + b" HTTP/1.1\r\nHost: b\r\n\r\n", 414, "uri_too_long",
         f"Request URI exceeds {LIMIT} bytes"),
        (b"GET /v1/runs/x HTTP/1.1\r\nHost: b\r\nIdempotency-Key: " + b"k" * 9000 + b"\r\n\r\n", 431,
         "header_too_large", f"Request header fields exceed {LIMIT} bytes"),
        (b"GET /v1/runs/x HTTP/1.1\r\nHost: b\r\nReferer: /" + b"r" * 9000 + b"\r\n\r\n", 431,
         "header_too_large", f"Request header fields exceed {LIMIT} bytes"),
        (b"GET /v1/runs/x HTTP/1.1\r\nHost: b\r\nX-" + b"n" * 9000 + b": 1\r\n\r\n", 431,
         "header_too_large", f"Request header fields exceed {LIMIT} bytes"),
        (b"GET /v1/runs/x HTTP/1.1\r\nHost: b\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
         431, "header_too_large", "Request has more than 128 header fields"),
    ],
    ids=["path-9000", "query-over-limit", "header-value-9000", "header-value-like-a-path", "header-name-9000",
         "200-headers"],
)  # fmt: skip
async def test_requests_over_the_parser_limits_answer_414_or_431_in_the_envelope(
    client: TestClient[Any, Any], request_bytes: bytes, status: int, code: str, message: str
) -> None:
    # When a request's URI or headers exceed aiohttp's limits
    answer, head, body = await _raw(client, request_bytes)
    # Then the answer names the limit in the envelope, with the status for that part of the request
    assert (answer, body) == (
        status,
        {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}},
    )
    assert b"application/json" in head.lower()


async def test_a_request_just_within_the_limits_is_answered_normally(client: TestClient[Any, Any]) -> None:
    path = b"/v1/runs/" + b"j" * (LIMIT - 200)
    request = b"GET " + path + b" HTTP/1.1\r\nHost: b\r\nConnection: close\r\nX-Pad: " + b"p" * 8000 + b"\r\n\r\n"
    status, _, body = await _raw(client, request)
    assert status == 404 and body["error"]["code"] == "run_not_found"


async def test_a_rejected_key_stays_free(client: TestClient[Any, Any]) -> None:
    # Given creates that failed validation with one Idempotency-Key
    for body in (b"{}", b'{"input":5}', orjson.dumps(_ctx(url="ftp://x")), orjson.dumps(_with(reporting=0))):
        answer = await client.post("/v1/runs", data=body, headers={"Idempotency-Key": "k-free"})
        assert answer.status == 400
    # When a valid create uses the key, then it creates the job
    answer = await client.post("/v1/runs", json=OK_INPUT, headers={"Idempotency-Key": "k-free"})
    assert answer.status == 202
    assert (await answer.json())["replayed"] is False
    assert "Idempotency-Replayed" not in answer.headers


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE", "PUT", "PATCH"])
@pytest.mark.parametrize("path", ["/v1/runs/reviews", "/nope", "/v1/run", "/v1/runs/job_x/nope", "/v2/runs"])
async def test_unknown_paths_answer_404_in_the_envelope(client: TestClient[Any, Any], method: str, path: str) -> None:
    answer = await client.request(method, path, data=b'{"input":"x"}')
    assert answer.status == 404
    assert answer.content_type == "application/json"
    assert_envelope(await answer.json(), "not_found")


@pytest.mark.parametrize(("method", "path"), [("PATCH", "/v1/runs"), ("DELETE", "/v1/runs"), ("PUT", "/v1/runs/job_1")])
async def test_a_wrong_method_answers_405_in_the_envelope(client: TestClient[Any, Any], method: str, path: str) -> None:
    answer = await client.request(method, path)
    assert answer.status == 405
    assert answer.content_type == "application/json"
    assert_envelope(await answer.json(), "method_not_allowed")
    assert "POST" in answer.headers.get("Allow", "") or "GET" in answer.headers.get("Allow", "")


async def test_an_unknown_run_answers_404_run_not_found(client: TestClient[Any, Any]) -> None:
    for run_id in ("job_0123456789abcdef0123456789abcdef", "run_abc", "x" * 300):
        answer = await client.get(f"/v1/runs/{run_id}")
        assert answer.status == 404
        error = assert_envelope(await answer.json(), "run_not_found")
        assert error["type"] == "invalid_request_error"


async def test_a_body_over_10_mb_answers_413(client: TestClient[Any, Any], redis: Redis) -> None:
    before = await redis.dbsize()
    body = io.BytesIO(b'{"input":"' + b"x" * 10_000_001 + b'"}')
    answer = await client.post("/v1/runs", data=body, headers={"Content-Type": "application/json"})
    assert answer.status == 413
    assert answer.content_type == "application/json"
    assert_envelope(await answer.json(), "body_too_large")
    assert await redis.dbsize() == before


async def test_a_body_just_under_10_mb_is_accepted(client: TestClient[Any, Any]) -> None:
    # The request limit: what Hermes gets is only the execution body (HERMES_MAX_BODY), the rest stays here
    body = io.BytesIO(b'{"input":"x","ignored":"' + b"x" * 9_000_000 + b'"}')
    answer = await client.post("/v1/runs", data=body, headers={"Content-Type": "application/json"})
    assert answer.status == 202


async def test_the_content_type_is_not_required(client: TestClient[Any, Any]) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded", "nonsense"):
        answer = await client.post("/v1/runs", data=b'{"input":"x"}', headers={"Content-Type": content_type})
        assert answer.status == 202
