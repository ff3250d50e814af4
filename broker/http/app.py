"""The HTTP edge's app: middlewares (the request log, the error envelope) and the routes it serves.

What the routes serve (the Redis clients, the job service, the driver, the board) is wired by the composition
root, `broker/app.py`, which builds on `web_app`."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

from aiohttp import web

from broker.http import health, listing, openapi, routes, sse, usage
from broker.http.appkeys import inflight_key
from broker.http.errors import Handler, error_middleware
from broker.http.protocol import envelope_protocol_errors
from broker.logging import get_logger

MAX_BODY = 10_000_000

_QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


Context = Callable[[web.Application], AsyncIterator[None]]


def web_app(services: Sequence[Context]) -> web.Application:
    """An app with the edge's middlewares and the broker's routes (/v1/runs, the listing, SSE, operations).

    `services`: cleanup contexts that put what the routes serve on the app (Redis, the job service, ...); they are
    entered in order before the edge's own (the SSE hub reads Redis) and left after them."""
    envelope_protocol_errors()
    app = web.Application(client_max_size=MAX_BODY, middlewares=[_request_log, error_middleware])
    app.cleanup_ctx.extend(services)
    routes.register(app)
    listing.register(app)
    usage.register(app)
    sse.register(app)
    health.register(app)
    openapi.register(app)
    return app


_REQUEST_LOG = get_logger("broker.http.app.RequestLog")


@web.middleware
async def _request_log(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.perf_counter()
    quiet = request.path in _QUIET_PATHS
    inflight = request.app[inflight_key]
    if not quiet:  # a drain waits for these, not for readiness probes
        inflight.enter()
    try:
        response = await handler(request)
    finally:
        if not quiet:
            inflight.leave()
    level = logging.DEBUG if quiet else logging.INFO
    if _REQUEST_LOG.isEnabledFor(level):  # the fields cost a little: not gathered for a line nobody writes
        fields = {
            "method": request.method,
            "path": request.path,
            "status": response.status,
            "durationMs": round((time.perf_counter() - started) * 1000, 1),
            "remote": request.remote,
        }
        _REQUEST_LOG.log(level, "Answered a request.", extra=fields)
    return response
