"""Every failure answers the Hermes envelope; no route answers plain text or HTML."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage
from aiohttp.web_protocol import RequestPayloadError

from broker.errors import BrokerError, Unavailable
from broker.http.render import json_response
from broker.logging import get_logger
from broker.store.outage import is_outage, outage_name

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_HTTP_CODES = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "body_too_large",
    415: "unsupported_media_type",
}

_log = get_logger("broker.http.errors.ErrorMiddleware")


def envelope(
    status: int,
    message: str,
    *,
    code: str | None,
    type_: str = "invalid_request_error",
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return json_response(body, status=status, headers=headers)


def from_broker_error(error: BrokerError) -> web.Response:
    headers = {"Retry-After": str(error.retry_after_s)} if error.retry_after_s is not None else None
    return envelope(error.status, error.message, code=error.code, type_=error.type, param=error.param, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    response = await _answer(request, handler)
    if isinstance(request.content.exception(), RequestPayloadError):
        _end_body(request, response)  # a body the handler did not read, which cannot be decoded
    return response


async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestPayloadError as error:
        return _refused_body(request, error)  # raised by reading the body
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return _from_http_exception(error)
    except Exception as error:
        if error is request.content.exception():
            return _client_left(request, error)
        if is_outage(error):
            # Redis is down, restarting or failing over (the client already retried): a retryable 503, not a bug.
            extra = {"method": request.method, "path": request.path, "error": outage_name(error)}
            _log.warning("Redis could not answer a request.", extra=extra)
            if isinstance(error, Unavailable):
                return from_broker_error(error)
            return from_broker_error(Unavailable("Redis is unavailable; try again"))
        if isinstance(error, BrokerError):
            return from_broker_error(error)
        # The last guard: a bug must still answer the envelope, and is logged with its traceback.
        _log.exception("Failed to answer a request.", extra={"method": request.method, "path": request.path})
        return envelope(500, "The broker failed to answer this request", code="internal_error", type_="server_error")


def _client_left(request: web.Request, error: Exception) -> web.Response:
    """The client closed its connection while it sent the body: nobody awaits the answer, and Redis is not at
    fault (the connection error is the client's, not a Redis connection's)."""
    fields = {"method": request.method, "path": request.path, "error": type(error).__name__}
    _log.debug("The client left while it sent its request.", extra=fields)
    return envelope(400, "The connection closed before the body was read", code="bad_request")


def _refused_body(request: web.Request, error: RequestPayloadError) -> web.Response:
    """400 for a body aiohttp cannot decode (e.g. `Content-Encoding: gzip` on bytes that are not gzip, a broken
    chunk): the client got it wrong, so one warn line of the log contract, without a traceback."""
    cause = error.__cause__ if isinstance(error.__cause__, BadHttpMessage) else None
    fields = {"status": 400, "code": "bad_request", "remote": request.remote, "error": type(cause or error).__name__}
    _log.warning("Refused a malformed HTTP request.", extra=fields)
    detail = cause.message if cause is not None else "the body cannot be read"
    response = envelope(400, f"Malformed HTTP request: {detail}", code="bad_request")
    _end_body(request, response)
    return response


def _end_body(request: web.Request, response: web.StreamResponse) -> None:
    """Close the connection after `response`, and mark the broken body read: aiohttp would read the rest of it
    after the answer and log the decoding error again as an unhandled exception."""
    response.force_close()
    request.content.feed_eof()


def _from_http_exception(error: web.HTTPException) -> web.Response:
    headers = {"Allow": error.headers["Allow"]} if "Allow" in error.headers else None
    message = {
        404: "Not found",
        405: "Method not allowed",
        413: "Request body is larger than 10 MB",
    }.get(error.status, error.reason)
    return envelope(error.status, message, code=_HTTP_CODES.get(error.status), headers=headers)
