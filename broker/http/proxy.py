"""Relay of Hermes-native runs (SPEC S3.7): with RUNS_PROXY_ENABLED, a run id that names no broker job is
forwarded to Hermes and its answer relayed, event streams chunk by chunk. Used by every /v1/runs/{id} route.
With several upstreams (SPEC S10) they are asked in HERMES_URL order and the first answer that is not a 404 is
relayed; all 404: the first 404; none answered but 404s: 503 (the run may be on one that did not answer)."""

from __future__ import annotations

import asyncio
from contextlib import suppress
from urllib.parse import quote

import aiohttp
from aiohttp import web

from broker import errors
from broker.hermes.client import HermesClient
from broker.hermes.models import Forwarded, Unavailable, parse_json_object
from broker.http import appkeys
from broker.http.errors import envelope
from broker.http.hub import hub_key
from broker.logging import get_logger

STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
CLIENT_CHECK_S = 15  #: how often a quiet relayed stream checks that its client is still there

_log = get_logger("broker.http.proxy.Proxy")


async def proxy(request: web.Request, run_id: str, suffix: str = "") -> web.StreamResponse | None:
    """Forward `request` for Hermes run `run_id` (`suffix`: "", "/events", "/stop", "/approval") and relay
    Hermes's answer; None when the proxy is disabled. Raises `errors.Unavailable` (503) when Hermes is down."""
    if not request.app[appkeys.config_key].runs_proxy_enabled:
        return None
    path = f"/v1/runs/{quote(run_id, safe='')}{suffix}"
    if request.method == "GET" and suffix == "/events":
        return await _relay_stream(request, run_id, path)
    body = await request.read() if request.method != "GET" else b""
    not_found: Forwarded | None = None
    silent = False
    for upstream, client in request.app[appkeys.fleet_key]:
        outcome = await client.forward(request.method, path, body or None)
        fields = {"run": run_id, "path": path, "upstream": upstream.name}
        if isinstance(outcome, Unavailable):
            _log.warning("Hermes did not answer a proxied run.", extra={**fields, "error": outcome.reason})
            silent = True
            continue
        if outcome.status == 404:
            not_found = not_found or outcome
            continue
        _log.info("Proxied a Hermes run.", extra={**fields, "status": outcome.status})
        return _relayed(outcome)
    if silent or not_found is None:
        raise errors.Unavailable("Hermes did not answer")
    _log.info("Proxied a Hermes run.", extra={"run": run_id, "path": path, "status": 404})
    return _relayed(not_found)


async def proxy_or_not_found(request: web.Request, run_id: str, suffix: str = "") -> web.StreamResponse:
    """`proxy()`, or 404 `run_not_found` when the proxy is disabled."""
    response = await proxy(request, run_id, suffix)
    if response is None:
        raise errors.JobNotFound(run_id)
    return response


def _relayed(answer: Forwarded) -> web.Response:
    if parse_json_object(answer.body) is None:
        # Never relay plain text or HTML (e.g. a reverse proxy's error page): the envelope, always.
        return envelope(502, "Hermes answered with a body that is not JSON.", code="bad_gateway", type_="server_error")
    return web.Response(status=answer.status, body=answer.body, headers=answer.headers)


async def _relay_stream(request: web.Request, run_id: str, path: str) -> web.StreamResponse:
    """The first upstream's stream (or answer) that is not a 404, in HERMES_URL order (SPEC S10)."""
    not_found: Forwarded | None = None
    silent = False
    for upstream, client in request.app[appkeys.fleet_key]:
        try:
            response = await _relay_stream_of(request, client, run_id, path, upstream.name)
        except errors.Unavailable:
            silent = True
            continue
        if isinstance(response, Forwarded):
            not_found = not_found or response
            continue
        return response
    if silent or not_found is None:
        raise errors.Unavailable("Hermes did not answer")
    _log.info("Proxied a Hermes run.", extra={"run": run_id, "path": path, "status": 404})
    return _relayed(not_found)


async def _relay_stream_of(
    request: web.Request, hermes: HermesClient, run_id: str, path: str, name: str
) -> web.StreamResponse | Forwarded:
    """One upstream's stream relayed, or its 404 (for the next upstream to be asked)."""
    try:
        async with hermes.forward_stream(path) as upstream:
            if upstream.status == 404:
                return await _answer(upstream)
            fields = {"run": run_id, "path": path, "status": upstream.status, "upstream": name}
            _log.info("Proxied a Hermes run.", extra=fields)
            if upstream.status != 200:
                return _relayed(await _answer(upstream))
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **STREAM_HEADERS})
            await response.prepare(request)
            metrics = request.app[appkeys.metrics_key]
            metrics.sse_open.inc()
            try:
                await _pump(request, upstream, response)
            finally:
                metrics.sse_open.dec()
            with suppress(ConnectionResetError):
                await response.write_eof()
            return response
    except errors.Unavailable:
        _log.warning("Hermes did not answer a proxied run.", extra={"run": run_id, "path": path, "upstream": name})
        raise errors.Unavailable("Hermes did not answer") from None


async def _answer(upstream: aiohttp.ClientResponse) -> Forwarded:
    try:
        body = await upstream.read()
    except (aiohttp.ClientError, OSError):
        raise errors.Unavailable("Hermes did not answer") from None
    content_type = upstream.headers.get("Content-Type")
    return Forwarded(upstream.status, {"Content-Type": content_type} if content_type else {}, body)


async def _pump(request: web.Request, upstream: aiohttp.ClientResponse, response: web.StreamResponse) -> None:
    """Copy chunks as they come until Hermes ends the stream, the client leaves, or the replica shuts down."""
    stopping = asyncio.ensure_future(_stopped(request.app[hub_key].stopping))
    read: asyncio.Future[bytes] | None = None
    try:
        while True:
            read = read or asyncio.ensure_future(upstream.content.readany())
            done, _ = await asyncio.wait({read, stopping}, timeout=CLIENT_CHECK_S, return_when=asyncio.FIRST_COMPLETED)
            if stopping in done:
                return
            if read not in done:
                transport = request.transport
                if transport is None or transport.is_closing():
                    return
                continue
            chunk, read = read.result(), None
            if not chunk:
                return
            await response.write(chunk)
    except (aiohttp.ClientError, OSError):
        return  # Hermes broke the stream or the client left: end ours (OSError covers ConnectionResetError)
    finally:
        for future in (stopping, read):
            if future is not None:
                future.cancel()


async def _stopped(event: asyncio.Event) -> bytes:
    await event.wait()
    return b""
