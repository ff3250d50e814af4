"""Request body limits: Hermes 0.19.0's own, and an optional proxy in front of it that takes less."""

from __future__ import annotations

from aiohttp import web

from broker.simulator.state import Settings

#: Hermes 0.19.0's `MAX_REQUEST_BYTES`: its aiohttp app's `client_max_size`, and the Content-Length it refuses past.
MAX_REQUEST_BYTES = 10_000_000

#: What nginx answers past its `client_max_body_size` (its default is 1 MiB): an HTML page, not Hermes's envelope.
PROXY_TOO_LARGE = (
    "<html>\r\n<head><title>413 Request Entity Too Large</title></head>\r\n<body>\r\n"
    "<center><h1>413 Request Entity Too Large</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n"
)


def refused_body(request: web.Request, settings: Settings) -> web.Response | None:
    """The answer to a request whose declared body is too large (the proxy's first, then Hermes's), or None."""
    if request.method not in ("POST", "PUT", "PATCH") or (declared := request.headers.get("Content-Length")) is None:
        return None
    try:
        size = int(declared)
    except ValueError:
        return web.json_response(_envelope("Invalid Content-Length header.", "invalid_content_length"), status=400)
    if 0 < settings.proxy_max_body < size:
        return web.Response(status=413, text=PROXY_TOO_LARGE, content_type="text/html")
    if size > MAX_REQUEST_BYTES:
        return too_large()
    return None


def too_large() -> web.Response:
    """Hermes's 413, also when aiohttp's `client_max_size` trips while a body without Content-Length is read."""
    return web.json_response(_envelope("Request body too large.", "body_too_large"), status=413)


def _envelope(message: str, code: str) -> dict[str, object]:
    return {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
