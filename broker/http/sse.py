"""GET /v1/runs/{id}/events (SPEC S3.3): replay the job's stream after the client's last id, then follow it
live through the replica's hub; one frame per shown event, `id:` = stream id, no `event:` line."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress

from aiohttp import web

from broker.errors import InvalidRequest
from broker.http import appkeys
from broker.http.hub import Frame, Hub, Signal, Subscription, frames, hub_key, id_key
from broker.http.proxy import proxy_or_not_found
from broker.ids import JOB_PREFIX
from broker.logging import get_logger
from broker.store.jobs import START, JobStore
from broker.store.outage import is_outage, outage_name

PAGE = 500  #: entries per replay XRANGE
SEND_TIMEOUT_S = 30  #: a client that does not take a write within this is dropped
HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
KEEPALIVE = b": keepalive\n\n"
CLOSED = b": stream closed\n\n"
EVENT_ID = re.compile(r"([0-9]{1,20})-([0-9]{1,20})")
_MAX_PART = 2**64 - 1

_log = get_logger("broker.http.sse.EventStream")


def resume_after(request: web.Request) -> str:
    """The id to resume strictly after: `Last-Event-ID` wins over `?after=`; empty counts as absent."""
    header = request.headers.get("Last-Event-ID", "")
    value, name = (header, "Last-Event-ID") if header else (request.query.get("after", ""), "after")
    if not value:
        return START
    match = EVENT_ID.fullmatch(value)
    if match is None or int(match[1]) > _MAX_PART or int(match[2]) > _MAX_PART:
        raise InvalidRequest(
            "invalid_last_event_id", f"{name} must be an event id of this stream (<ms>-<seq>)", param=name
        )
    return value


class _Stream:
    """One client's response and what it has been sent."""

    def __init__(self, request: web.Request, response: web.StreamResponse, job_id: str, after: str) -> None:
        self.request, self.response, self.job_id = request, response, job_id
        self.last, self.last_key = after, id_key(after)
        self.sent = 0

    async def send(self, batch: list[Frame]) -> bool:
        """Write the frames after the last sent id; True once the terminal frame is written."""
        fresh = [frame for frame in batch if frame.key > self.last_key]
        terminal = bool(fresh) and fresh[-1].terminal
        if fresh:
            await self._write(b"".join(frame.data for frame in fresh) + (CLOSED if terminal else b""))
            self.sent += len(fresh)
            self.advance(fresh[-1].id)
        return terminal

    async def close(self) -> None:
        await self._write(CLOSED)

    def advance(self, stream_id: str) -> None:
        key = id_key(stream_id)
        if key > self.last_key:
            self.last, self.last_key = stream_id, key

    async def keepalive(self) -> bool:
        """Write a keepalive comment; False when the client is gone."""
        transport = self.request.transport
        if transport is None or transport.is_closing():
            return False
        await self._write(KEEPALIVE)
        return True

    async def _write(self, data: bytes) -> None:
        async with asyncio.timeout(SEND_TIMEOUT_S):
            await self.response.write(data)


async def stream_events(request: web.Request) -> web.StreamResponse:
    run_id = request.match_info["run_id"]
    store, hub = request.app[appkeys.store_key], request.app[hub_key]
    # Errors are raised before the response is prepared, so the middleware can still answer the envelope.
    snapshot = await store.load(run_id) if run_id.startswith(JOB_PREFIX) else None
    if snapshot is None:
        return await proxy_or_not_found(request, run_id, "/events")
    after = resume_after(request)
    response = web.StreamResponse(headers=HEADERS)
    await response.prepare(request)
    stream = _Stream(request, response, run_id, after)
    # Loaded before the replay: a job already over has its terminal event inside the replayed range.
    ended = snapshot.view.status.terminal
    async with _opened(request, stream):
        block_s = request.app[appkeys.config_key].runs_event_block_ms / 1000
        finished = await _serve(stream, store, hub, block_s, ended=ended)
        if finished or hub.stopping.is_set():
            with suppress(ConnectionResetError):
                await response.write_eof()
    return response


async def _serve(stream: _Stream, store: JobStore, hub: Hub, block_s: float, *, ended: bool) -> bool:
    """Replay, then follow; True when the stream ended normally (terminal frame, or shutdown)."""
    try:
        if await _replay(stream, store, hub):
            return True
        if ended:  # resumed after the terminal event: nothing will ever follow
            await stream.close()
            return True
        subscription = hub.subscribe(stream.job_id, stream.last)
        try:
            return await _follow(stream, store, hub, subscription, block_s)
        finally:
            hub.unsubscribe(subscription)
    except (ConnectionResetError, TimeoutError):
        return False  # the client is gone (or stalled past SEND_TIMEOUT_S)
    except Exception as error:
        if not is_outage(error):
            raise
        _log.warning("Failed to read a job's events.", extra={"job": stream.job_id, "error": outage_name(error)})
        return False  # the client reconnects with its last id


async def _follow(stream: _Stream, store: JobStore, hub: Hub, subscription: Subscription, block_s: float) -> bool:
    # Registered first, then read: the hub's handoff contract (broker.http.hub).
    if await _replay(stream, store, hub):
        return True
    while True:
        item = await subscription.next(block_s)
        if item is Signal.CLOSED:
            return True
        if item is Signal.IDLE:
            if not await stream.keepalive():
                return False
        elif item is Signal.OVERFLOWED:
            subscription.resume()
            if await _replay(stream, store, hub):
                return True
        elif await stream.send([item, *subscription.ready()]):
            return True


async def _replay(stream: _Stream, store: JobStore, hub: Hub) -> bool:
    """Send the stored events after the last sent id, in bounded pages; True when the feed ended."""
    while not hub.stopping.is_set():
        entries = await store.read(stream.job_id, stream.last, count=PAGE)
        if await stream.send(frames(stream.job_id, entries)):
            return True
        if entries:
            stream.advance(entries[-1][0])  # hidden events count as sent: the next page starts after them
        if len(entries) < PAGE:
            return False
    return True


@asynccontextmanager
async def _opened(request: web.Request, stream: _Stream) -> AsyncIterator[None]:
    """Log and count an open stream."""
    metrics, after, started = request.app[appkeys.metrics_key], stream.last, time.monotonic()
    metrics.sse_open.inc()
    _log.debug("Opened an event stream.", extra={"job": stream.job_id, "after": after})
    try:
        yield
    finally:
        metrics.sse_open.dec()
        duration_ms = round((time.monotonic() - started) * 1000)
        extra = {"job": stream.job_id, "after": after, "sent": stream.sent, "durationMs": duration_ms}
        _log.debug("Closed an event stream.", extra=extra)


async def _hub_context(app: web.Application) -> AsyncIterator[None]:
    # After the Redis context in app.cleanup_ctx: started after it, stopped before it.
    hub = app[hub_key] = Hub(app[appkeys.redis_key])
    await hub.start()
    yield
    hub.close_subscribers()
    await hub.stop()


async def end_streams(app: web.Application) -> None:
    """End every open event stream without a terminal frame (clients resume elsewhere with their last id)."""
    if hub_key in app and not app[hub_key].stopping.is_set():
        open_streams = app[hub_key].subscribers
        app[hub_key].close_subscribers()
        _log.info("Ended event streams on shutdown.", extra={"streams": open_streams})


def register(app: web.Application) -> None:
    app.router.add_get("/v1/runs/{run_id}/events", stream_events)
    app.cleanup_ctx.append(_hub_context)
    app.on_shutdown.append(end_streams)
