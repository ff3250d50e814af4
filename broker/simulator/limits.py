"""Hermes 0.19.0's request body limit."""

from __future__ import annotations

from aiohttp import web

from broker.simulator.state import Settings

#: Hermes 0.19.0's `MAX_REQUEST_BYTES`: its aiohttp app's `client_max_size`, and the Content-Length it refuses past.
MAX_REQUEST_BYTES = 10_000_000


def refused_body(request: web.Request, settings: Settings) -> web.Response | None:
    """The answer to a request whose declared body is too large (Hermes's 413), or None."""
    if request.method not in ("POST", "PUT", "PATCH") or (declared := request.headers.get("Content-Length")) is None:
        return None
    try:
        size = int(declared)
    except ValueError:
        return web.json_response(_envelope("Invalid Content-Length header.", "invalid_content_length"), status=400)
    if size > MAX_REQUEST_BYTES:
        return too_large()
    return None


def too_large() -> web.Response:
    """Hermes's 413, also when aiohttp's `client_max_size` trips while a body without Content-Length is read."""
    return web.json_response(_envelope("Request body too large.", "body_too_large"), status=413)


def _envelope(message: str, code: str) -> dict[str, object]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
