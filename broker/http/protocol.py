"""HTTP protocol errors in the envelope too.

aiohttp answers a request it cannot parse (control bytes in a header, a header line over its
limit, a bad method) itself, before any middleware, with text/plain. SPEC S3 allows no plain-text
error whatever the input, so the broker replaces that answer's body with the Hermes envelope.
aiohttp builds its protocol handlers internally, so this is a process-wide patch of one method,
applied once by the app factory; it keeps aiohttp's logging and connection handling.

aiohttp reports every parse failure as 400. A request line over its limit answers 414 `uri_too_long`
and header fields over theirs (one too long, or too many) 431 `header_too_large`, naming the limit.

A request the client got wrong is logged as one warn line of the log contract, without a traceback (aiohttp
logs it as an error with one); a garbled first request (a TLS handshake or a port scan) only at debug, as
aiohttp does. A failure of the broker's own (a 500) keeps aiohttp's error line and traceback.
"""

from __future__ import annotations

import logging
import re
import traceback
from http import HTTPStatus

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, BadHttpMethod, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from broker.http.render import json_response
from broker.logging import get_logger

_PATCHED = "_hbr_envelope"
_log = get_logger("broker.http.protocol.ProtocolErrors")
_TOO_MANY_HEADERS = "Too many headers received"  #: aiohttp's message (both parsers) past max_headers
#: The pure-Python parser reports the whole request line, which starts with its method; a header
#: line starts with its name and a colon.
_REQUEST_LINE = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+ ")


def envelope_protocol_errors() -> None:
    original = RequestHandler.handle_error
    if getattr(original, _PATCHED, False):
        return

    def handle_error(
        self: RequestHandler,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        status, code, text = answer(status, exc, max_headers=self.max_headers)
        if status >= 500:
            original(self, request, status, exc, message)  # logs; raises if a response was already started
        else:
            _refused(self, request, status, code, exc)
        error = {
            "message": text,
            "type": "invalid_request_error" if status < 500 else "server_error",
            "param": None,
            "code": code,
        }
        response = json_response({"error": error}, status=status)
        response.force_close()
        return response

    setattr(handle_error, _PATCHED, True)
    RequestHandler.handle_error = handle_error  # type: ignore[method-assign]


def _refused(handler: RequestHandler, request: BaseRequest, status: int, code: str, exc: BaseException | None) -> None:
    """Log a request the client got wrong; raise as aiohttp does when an answer was already started."""
    level = logging.DEBUG if isinstance(exc, BadHttpMethod) and handler._request_count == 1 else logging.WARNING
    fields = {"status": status, "code": code, "remote": request.remote, "error": type(exc).__name__ if exc else None}
    _log.log(level, "Refused a malformed HTTP request.", extra=fields)
    if request.writer.output_size > 0:
        raise ConnectionError("Response is sent already, cannot send another response with the error message")


def answer(status: int, exc: BaseException | None, *, max_headers: int) -> tuple[int, str, str]:
    """(status, code, message) of the envelope for what aiohttp's parser raised."""
    if isinstance(exc, LineTooLong):
        limit = exc.args[1] if len(exc.args) > 1 else "its limit of"
        if _in_request_line(exc):
            return 414, "uri_too_long", f"Request URI exceeds {limit} bytes"
        return 431, "header_too_large", f"Request header fields exceed {limit} bytes"
    if isinstance(exc, BadHttpMessage) and exc.message == _TOO_MANY_HEADERS:
        return 431, "header_too_large", f"Request has more than {max_headers} header fields"
    if status >= 500:
        return status, "internal_error", "The broker failed to answer"
    phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
    return status, "bad_request", f"Malformed HTTP request: {phrase}"


def _in_request_line(exc: LineTooLong) -> bool:
    """Whether the line over the limit was the request line (the URI), not a header field.

    LineTooLong says neither, so this reads where it was raised: the C parser raises it in its
    `cb_on_url` callback for the URI and `cb_on_header_field` / `cb_on_header_value` for headers.
    """
    frames = [frame.f_code.co_name for frame, _ in traceback.walk_tb(exc.__traceback__)]
    innermost = frames[-1] if frames else ""
    if innermost.endswith("cb_on_url"):
        return True
    if "cb_on_header" in innermost:
        return False
    line = exc.args[0] if exc.args else b""
    return isinstance(line, bytes | bytearray) and _REQUEST_LINE.match(line) is not None
