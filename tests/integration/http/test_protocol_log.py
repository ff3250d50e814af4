"""What a request aiohttp cannot parse logs (SPEC S6): one warn line of the contract, never an error traceback."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.app import create_app
from broker.config import Config
from broker.http.appkeys import inflight_key
from broker.store.embedded import free_port

LIMIT = 8190  # aiohttp's max_line_size and max_field_size
OURS = "broker.http.protocol.ProtocolErrors"


async def _send(client: TestClient[Any, Any], request: bytes) -> int:
    """Send `request` as is over a fresh connection; the answer's status."""
    reader, writer = await asyncio.open_connection(client.server.host, client.server.port)
    writer.write(request)
    await writer.drain()
    try:
        answer = await reader.read()
    finally:
        writer.close()
        await writer.wait_closed()
    return int(answer.split(b" ")[1])


@pytest.mark.parametrize(
    ("request_bytes", "status", "code", "error"),
    [
        (b"GET /v1/runs/" + b"j" * 9000 + b" HTTP/1.1\r\nHost: b\r\n\r\n", 414, "uri_too_long", "LineTooLong"),
        (b"GET /v1/runs/x HTTP/1.1\r\nHost: b\r\nReferer: /" + b"r" * 9000 + b"\r\n\r\n", 431, "header_too_large",
         "LineTooLong"),
        (b"GET /v1/runs/x HTTP/1.1\r\nHost: b\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
         431, "header_too_large", "BadHttpMessage"),
        (b"GET /v1/runs/x HTTP/1.1\r\nHost: b\r\nX-Hermes-Session-Key: a\x01b\r\n\r\n", 400, "bad_request",
         "BadHttpMessage"),
    ],
    ids=["uri-414", "header-431", "header-count-431", "control-byte-400"],
)  # fmt: skip
async def test_a_request_the_client_got_wrong_logs_one_warn_line_without_a_traceback(
    client: TestClient[Any, Any], caplog: pytest.LogCaptureFixture, request_bytes: bytes, status: int, code: str,
    error: str
) -> None:  # fmt: skip
    caplog.set_level(logging.DEBUG)
    # When a request over aiohttp's limits (or with bytes it refuses) arrives
    assert await _send(client, request_bytes) == status
    # Then one warn line says so, its fields at the root, without a traceback
    ours = [record for record in caplog.records if record.name == OURS]
    assert [(r.levelno, r.getMessage()) for r in ours] == [(logging.WARNING, "Refused a malformed HTTP request.")]
    [line] = ours
    assert (line.status, line.code, line.remote, line.error) == (status, code, "127.0.0.1", error)  # type: ignore[attr-defined]
    assert line.exc_info is None and line.exc_text is None
    # And nothing else logs it as an error (aiohttp's "Error handling request" with its traceback)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []


async def test_a_first_request_that_is_not_http_logs_only_at_debug(
    client: TestClient[Any, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # When a TLS handshake (or a port scan) reaches the plain HTTP port
    assert await _send(client, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03 HTTP/1.1\r\n\r\n") == 400
    # Then it is one debug line of the contract: the internet's noise, not a warning
    ours = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == OURS]
    assert ours == [(logging.DEBUG, "Refused a malformed HTTP request.")]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info] == []


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/runs/job_x/stop"])
async def test_a_body_that_cannot_be_decoded_is_a_400_and_one_warn_line(
    client: TestClient[Any, Any], caplog: pytest.LogCaptureFixture, path: str
) -> None:
    caplog.set_level(logging.DEBUG)
    # When a body says it is gzip and is not, to a route that reads its body (or to one that does not)
    body = b'{"input": "hi"}'
    request = b"POST %s HTTP/1.1\r\nHost: b\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s"
    status = await _send(client, request % (path.encode(), len(body), body))
    # Then a route that reads it answers 400 in the envelope, with one warn line of the contract
    if path != "/v1/runs/job_x/stop":
        assert status == 400
        warned = [r for r in caplog.records if r.getMessage() == "Refused a malformed HTTP request."]
        assert [(r.levelno, r.code, r.error) for r in warned] == [
            (logging.WARNING, "bad_request", "ContentEncodingError")
        ]  # type: ignore[attr-defined]
    else:
        assert status == 404  # the stop reads no body: the unknown job answers
    # And nothing logs an error or a traceback (aiohttp's "Unhandled exception" while it drained the body)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []


async def test_a_client_that_leaves_mid_body_is_not_a_redis_outage(
    config: Config, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    # Given the broker served as `python -m broker` serves it: a client that leaves does not cancel its handler
    app = create_app(config, drive=False)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", free_port())
    await site.start()
    try:
        # When a client announces a body and closes the connection before it has sent it
        _, writer = await asyncio.open_connection("127.0.0.1", site._port)
        writer.write(b'POST /v1/runs HTTP/1.1\r\nHost: b\r\nContent-Length: 100\r\n\r\n{"input": ')
        await writer.drain()
        await _until(lambda: app[inflight_key].count == 1)  # the create waits for the rest of its body
        writer.close()
        await writer.wait_closed()
        # Then the broker says so at debug, and nothing blames Redis or logs an error
        left = "The client left while it sent its request."
        await _until(lambda: any(r.getMessage() == left for r in caplog.records))
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info] == []
    finally:
        await runner.cleanup()


async def _until(probe: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not probe():
        assert asyncio.get_running_loop().time() < deadline, "not within the timeout"
        await asyncio.sleep(0.01)
