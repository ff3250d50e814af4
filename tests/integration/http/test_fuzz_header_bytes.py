"""Fuzzing the create's headers with raw bytes (SPEC S3.1): whatever bytes a header carries (latin-1 high bytes,
invalid UTF-8, control bytes), the create answers 202 or a 4xx in the Hermes envelope, never a 5xx.

aiohttp's client refuses to send such headers, so these requests are written on a socket by hand."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp.test_utils import TestClient
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from broker.store.jobs import JobStore

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
ALLOWED = {202, 400, 403, 413, 415}
#: every header the create route reads (routes.py, crosssite.py, schemas.py) and the framing ones aiohttp reads
HEADERS = ("X-Hermes-Session-Key", "Idempotency-Key", "Content-Type", "traceparent", "Origin", "Sec-Fetch-Site", "Host")
#: Any bytes but CR and LF, which end a header line (a protocol matter, fuzzed in test_errors.py); high bytes are
#: drawn often, as they are the ones a text strategy never produces.
header_bytes = st.binary(max_size=300).map(lambda raw: raw.replace(b"\r", b"").replace(b"\n", b"")) | st.lists(
    st.integers(0x80, 0xFF), max_size=40
).map(bytes)
BODY = b'{"input":"fuzz"}'


async def _post(port: int, headers: dict[str, bytes]) -> tuple[int, dict[str, str], bytes]:
    """POST /v1/runs with exactly these header bytes; (status, headers, body) of the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        lines = [b"POST /v1/runs HTTP/1.1"]
        if "Host" not in headers:
            lines.append(f"Host: 127.0.0.1:{port}".encode())
        lines += [name.encode() + b": " + value for name, value in headers.items()]
        lines += [f"Content-Length: {len(BODY)}".encode(), b"Connection: close", b"", b""]
        writer.write(b"\r\n".join(lines) + BODY)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), timeout=10)
    finally:
        writer.close()
        await writer.wait_closed()
    head, _, body = answer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    fields = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in header_lines)}
    return int(status_line.split()[1]), fields, body


def _port(client: TestClient[Any, Any]) -> int:
    assert client.port is not None
    return client.port


def _check(status: int, fields: dict[str, str], body: bytes) -> dict[str, Any]:
    """A status the create may answer, and JSON: the job object for a 202, the envelope for an error."""
    assert status in ALLOWED, (status, body)
    assert fields.get("content-type", "").startswith("application/json"), fields
    document: dict[str, Any] = orjson.loads(body)
    if status >= 400:
        assert set(document) == {"error"}, document
        assert set(document["error"]) == {"message", "type", "param", "code"}, document
        assert isinstance(document["error"]["message"], str) and document["error"]["message"]
    else:
        assert document["status"] == "queued", document
    return document


@FUZZ
@given(values=st.fixed_dictionaries({}, optional=dict.fromkeys(HEADERS, header_bytes)))
@example(values={"X-Hermes-Session-Key": b"\xa1"})
@example(values={"X-Hermes-Session-Key": b"caf\xc3\xa9", "Idempotency-Key": b"\xff"})
@example(values={"Host": b"\xa1", "Origin": b"http://\xa1"})
@example(values={"traceparent": b"00-\xa1\xa1-00", "Content-Type": b"application/json; charset=\xe9"})
async def test_any_header_bytes_on_create(client: TestClient[Any, Any], values: dict[str, bytes]) -> None:
    # Given the broker serving creates on a real Redis
    # When a create carries these bytes in its headers
    status, fields, body = await _post(_port(client), values)
    # Then it answers 202 or a 4xx, in JSON
    _check(status, fields, body)


async def test_a_session_key_that_is_not_utf8_is_a_400(client: TestClient[Any, Any]) -> None:
    # Given a latin-1 byte in X-Hermes-Session-Key (no UTF-8 text: neither storable nor forwardable as sent)
    # When it creates
    status, fields, body = await _post(_port(client), {"X-Hermes-Session-Key": b"caf\xe9"})
    # Then the answer is 400 invalid_session_key, and nothing is stored
    document = _check(status, fields, body)
    assert (status, document["error"]["code"]) == (400, "invalid_session_key")
    assert document["error"]["param"] == "X-Hermes-Session-Key"


async def test_a_utf8_session_key_is_stored_as_text(client: TestClient[Any, Any], redis: Redis) -> None:
    # Given a session key of non-ASCII UTF-8 text
    key = "café ☃ 会话"
    # When it creates
    status, fields, body = await _post(_port(client), {"X-Hermes-Session-Key": key.encode()})
    # Then the job is taken and stores the key as that text
    job = _check(status, fields, body)
    assert status == 202
    created = (await JobStore(redis, retention_ms=60_000).read(job["run_id"]))[0][1]
    assert created.session_key == key  # type: ignore[union-attr]
