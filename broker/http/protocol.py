"""HTTP protocol errors in the envelope too.

aiohttp answers a request it cannot parse (control bytes in a header, a header line over its
limit, a bad method) itself, before any middleware, with text/plain. SPEC S3 allows no plain-text
error whatever the input, so the broker replaces that answer's body with the Hermes envelope.
aiohttp builds its protocol handlers internally, so this is a process-wide patch of one method,
applied once by the app factory; it keeps aiohttp's logging and connection handling.
"""

from __future__ import annotations

from http import HTTPStatus

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

_PATCHED = "_hbr_envelope"


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
        original(self, request, status, exc, message)  # logs; raises if a response was already started
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"
        error = {
            "message": f"Malformed HTTP request: {phrase}." if status < 500 else "The broker failed to answer.",
            "type": "invalid_request_error" if status < 500 else "server_error",
            "param": None,
            "code": "bad_request" if status < 500 else "internal_error",
        }
        response = web.json_response({"error": error}, status=status)
        response.force_close()
        return response

    setattr(handle_error, _PATCHED, True)
    RequestHandler.handle_error = handle_error  # type: ignore[method-assign]
