"""The only outbound Hermes HTTP: the `HermesClient` port and its aiohttp implementation of `/v1/runs`.

Every call returns a typed outcome (see `models`); transport failures never raise. Event streams are async
iterators: when opening fails the only item is `NotFound`, `Unavailable` or `Unauthorized`; once opened, the
stream yields events and comments and always ends with exactly one `StreamEnded`. Close an iterator you leave
early (`contextlib.aclosing`) so its connection is released at once.
"""

from __future__ import annotations

import asyncio
import io
import time
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Protocol
from urllib.parse import quote

import aiohttp
from yarl import URL

from broker import errors, tracing
from broker.hermes.models import (
    Accepted,
    ApprovalOutcome,
    CreateOutcome,
    Forwarded,
    ForwardOutcome,
    GetOutcome,
    HermesRun,
    Rejected,
    Relayed,
    StopOutcome,
    Stopping,
    StreamEnded,
    StreamItem,
    Unauthorized,
    Unavailable,
    error_fields,
    parse_json_object,
)
from broker.hermes.outcomes import answer_text, create_outcome, failure_outcome
from broker.hermes.sse import read_stream
from broker.logging import get_logger
from broker.upstreams import health

#: Called after every Hermes call with (method, route, status or None, seconds): metrics.
Observer = Callable[[str, str, int | None, float], None]

#: Headers of a Hermes answer that the broker's proxy relays.
FORWARDED_HEADERS = ("Content-Type", "Retry-After")


class HermesClient(Protocol):
    """What the broker needs from Hermes's `/v1/runs` API."""

    async def create(
        self, body: bytes, *, idempotency_key: str | None = None, session_key: str | None = None
    ) -> CreateOutcome: ...

    async def get(self, run_id: str) -> GetOutcome: ...

    def events(self, run_id: str, *, idle_timeout_s: float) -> AsyncIterator[StreamItem]: ...

    async def stop(self, run_id: str) -> StopOutcome: ...

    async def approval(self, run_id: str, body: bytes) -> ApprovalOutcome: ...

    async def forward(self, method: str, path: str, body: bytes | None) -> ForwardOutcome: ...

    def forward_stream(self, path: str) -> AbstractAsyncContextManager[aiohttp.ClientResponse]: ...

    async def aclose(self) -> None: ...

    async def answered(self) -> None:
        """Return once a call to this server gets an answer (anything but a 5xx): it is back after failures."""
        ...


class _Reply:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: Mapping[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body


class AiohttpHermesClient:
    """`HermesClient` over one shared aiohttp session (created on first use unless one is passed in)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        timeout_ms: int,
        session: aiohttp.ClientSession | None = None,
        observe: Observer | None = None,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._timeout_s = timeout_ms / 1000
        self._timed_out = f"Hermes did not answer within {self._timeout_s:g} s."
        self._session = session
        self._owns_session = session is None
        self._observe = observe
        self.last_answered: bool | None = None  #: did Hermes answer the last call (None: no call yet)
        #: what this replica's calls met: answers (any call, stream events and keepalives) and failures (SPEC S10)
        self.heard = health.Heard()
        self._answer: asyncio.Event | None = None  #: set by the next answered call (callers backing off wait on it)
        self._log = get_logger(type(self))
        url = URL(self._base_url)
        self._server = (url.host or "", url.port or 0)
        self.upstream = f"{url.host}:{url.port}"  #: host:port, for traces (SPEC S6.1)

    async def create(
        self, body: bytes, *, idempotency_key: str | None = None, session_key: str | None = None
    ) -> CreateOutcome:
        headers = {"Content-Type": "application/json"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        if session_key is not None:
            headers["X-Hermes-Session-Key"] = session_key
        with self._span("create", "POST", "/v1/runs") as span:
            span.set("hermes.idempotency_key", idempotency_key)
            reply = await self._call("POST", "/v1/runs", body=body, headers=headers, span=span)
            if isinstance(reply, Unavailable):
                return reply
            if not is_answer(reply.status, reply.body):  # a gateway's 502/503/504: it may have forwarded the create
                return Unavailable(f"Hermes answered HTTP {reply.status}.", unanswered=True)
            outcome = create_outcome(reply.status, reply.headers, reply.body)
            if isinstance(outcome, Accepted):
                span.set(tracing.RUN, outcome.run_id)
            return outcome

    async def get(self, run_id: str) -> GetOutcome:
        with self._span("get", "GET", "/v1/runs/{run_id}", run_id) as span:
            reply = await self._call("GET", _run_path(run_id), span=span)
        if isinstance(reply, Unavailable):
            return reply
        if reply.status == 200 and (payload := parse_json_object(reply.body)) is not None:
            return HermesRun.from_api(payload)
        return failure_outcome(reply.status, run_id)

    async def stop(self, run_id: str) -> StopOutcome:
        with self._span("stop", "POST", "/v1/runs/{run_id}/stop", run_id) as span:
            reply = await self._call("POST", _run_path(run_id, "/stop"), span=span)
        if isinstance(reply, Unavailable):
            return reply
        payload = parse_json_object(reply.body)
        if reply.status == 200 and payload is not None:
            status = payload.get("status")
            return Stopping(run_id, status if isinstance(status, str) else "stopping")
        if 400 <= reply.status < 500 and reply.status not in (401, 403, 404):
            message, code = error_fields(payload)
            return Rejected(reply.status, message or answer_text(reply.status, reply.body), code)
        return failure_outcome(reply.status, run_id)

    async def approval(self, run_id: str, body: bytes) -> ApprovalOutcome:
        headers = {"Content-Type": "application/json"}
        with self._span("approval", "POST", "/v1/runs/{run_id}/approval", run_id) as span:
            reply = await self._call("POST", _run_path(run_id, "/approval"), body=body, headers=headers, span=span)
        if isinstance(reply, Unavailable):
            return reply
        if reply.status in (401, 403):
            return Unauthorized(reply.status)
        payload = parse_json_object(reply.body)
        if reply.status >= 500 or payload is None:
            return Unavailable(f"Hermes answered HTTP {reply.status}." if reply.status >= 500 else _NOT_JSON)
        return Relayed(reply.status, payload)

    async def events(self, run_id: str, *, idle_timeout_s: float) -> AsyncIterator[StreamItem]:
        # The span covers the whole stream; it is never made current (an async generator may be closed elsewhere).
        with self._span("events", "GET", "/v1/runs/{run_id}/events", run_id) as span:
            opened = await self._open(_run_path(run_id, "/events"), span)
            if isinstance(opened, Unavailable):
                yield opened
                return
            try:
                if opened.status != 200:
                    await opened.read()
                    yield failure_outcome(opened.status, run_id)
                    return
                async for item in read_stream(opened, idle_timeout_s):
                    if not isinstance(item, StreamEnded):
                        self.heard_now()
                    yield item
            finally:
                opened.close()

    async def forward(self, method: str, path: str, body: bytes | None) -> ForwardOutcome:
        headers = {"Content-Type": "application/json"} if body is not None else None
        reply = await self._call(method, path, body=body, headers=headers)
        if isinstance(reply, Unavailable):
            return reply
        kept = {name: reply.headers[name] for name in FORWARDED_HEADERS if name in reply.headers}
        return Forwarded(reply.status, kept, reply.body)

    @asynccontextmanager
    async def forward_stream(self, path: str) -> AsyncIterator[aiohttp.ClientResponse]:
        """The upstream response of a streaming GET, unread; raises `errors.Unavailable` when it cannot open."""
        opened = await self._open(path)
        if isinstance(opened, Unavailable):
            raise errors.Unavailable(f"Hermes did not answer: {opened.reason}")
        try:
            yield opened
        finally:
            opened.close()

    async def answered(self) -> None:
        """Return once a call to this server gets an answer (anything but a 5xx): it is back after failures.

        A run's poll backs off while its server does not answer (up to RUNS_BACKOFF_MAX); when another call gets
        through (a probe, another run's poll) every waiting poll goes at once rather than at the end of its wait."""
        if self._answer is None:
            self._answer = asyncio.Event()
        await self._answer.wait()

    async def aclose(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
        self._session = None

    async def _call(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
        span: tracing.Span = tracing.NO_SPAN,
    ) -> _Reply | Unavailable:
        started = time.monotonic()
        status: int | None = None
        answer = False
        sent = self._headers(headers)
        span.inject(sent)  # the call's span is Hermes's parent (SPEC S6.1)
        try:
            async with self._client().request(
                method,
                self._url(path),
                data=_payload(body),
                headers=sent,
                timeout=aiohttp.ClientTimeout(total=self._timeout_s),
            ) as response:
                status = response.status
                reply = _Reply(response.status, response.headers, await response.read())
                answer = is_answer(status, reply.body)  # a proxy's 502 in front of a dead Hermes is no answer
                return reply
        except TimeoutError:
            return Unavailable(self._timed_out, unanswered=True)
        except (aiohttp.ClientError, OSError) as exc:
            return Unavailable(_unreachable(exc), unanswered=_maybe_sent(exc))
        finally:
            self._logged(method, path, status, started, span, answer)

    async def _open(self, path: str, span: tracing.Span = tracing.NO_SPAN) -> aiohttp.ClientResponse | Unavailable:
        """Send a streaming GET and wait (within the request timeout) for its headers only."""
        started = time.monotonic()
        status: int | None = None
        # No read timeout: a stream may be quiet for long; the caller's idle timeout bounds it.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout_s, sock_read=None)
        sent = self._headers(None)
        span.inject(sent)
        answer = False
        try:
            async with asyncio.timeout(self._timeout_s):
                response = await self._client().get(self._url(path), headers=sent, timeout=timeout)
            status = response.status
            answer = status not in _PROXY_FAILURES or response.content_type == "application/json"
            return response
        except TimeoutError:
            return Unavailable(self._timed_out, unanswered=True)
        except (aiohttp.ClientError, OSError) as exc:
            return Unavailable(_unreachable(exc), unanswered=_maybe_sent(exc))
        finally:
            self._logged("GET", path, status, started, span, answer)

    def _span(self, operation: str, method: str, route: str, run_id: str | None = None) -> tracing.Span:
        """A client span of one Hermes call (no attributes are even built when tracing is off)."""
        if not tracing.enabled():
            return tracing.NO_SPAN
        attributes: dict[str, tracing.Value] = {
            "http.request.method": method,
            "url.template": route,
            "server.address": self._server[0],
            "server.port": self._server[1],
            tracing.UPSTREAM: self.upstream,
            tracing.RUN: run_id,
        }
        return tracing.start(tracing.HERMES_PREFIX + operation, kind=tracing.Kind.CLIENT, attributes=attributes)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession()
            self._owns_session = True
        return self._session

    def _url(self, path: str) -> URL:
        return URL(self._base_url + path, encoded=True)  # run ids are already quoted by _run_path

    def _headers(self, extra: dict[str, str] | None) -> dict[str, str]:
        headers = dict(extra or {})
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        return headers

    def heard_now(self) -> None:
        """An event or keepalive of a run's stream arrived: Hermes answers (SPEC S10)."""
        self.heard = health.answered(self.heard, int(time.time() * 1000))

    def _logged(
        self,
        method: str,
        path: str,
        status: int | None,
        started: float,
        span: tracing.Span = tracing.NO_SPAN,
        answer: bool = False,
    ) -> None:
        span.set("http.response.status_code", status)
        if status is None or status >= 400:
            span.fail("no answer" if status is None else f"HTTP {status}")
        elapsed = time.monotonic() - started
        duration_ms = round(elapsed * 1000)
        self.last_answered = status is not None and status < 500
        if self.last_answered and self._answer is not None:
            self._answer.set()  # the server is back: whoever backs off from it asks again now
            self._answer = None
        now_ms = int(time.time() * 1000)
        if answer:
            self.heard = health.answered(self.heard, now_ms)
        else:  # counted from when the call began: the upstream was silent since then
            self.heard = health.failed(self.heard, now_ms - duration_ms)
        if self._observe is not None:
            self._observe(method, _route(path), status, elapsed)
        self._log.debug(
            "Called Hermes.", extra={"method": method, "path": path, "status": status, "durationMs": duration_ms}
        )


_NOT_JSON = "Hermes answered without a JSON body."
#: What a proxy in front of a dead Hermes answers; without Hermes's JSON body it is no answer of Hermes's (SPEC S10).
_PROXY_FAILURES = frozenset({502, 503, 504})


def is_answer(status: int, body: bytes) -> bool:
    """Did Hermes itself answer? Any status but a 502/503/504 without Hermes's envelope or run object (SPEC S10): a
    gateway in front of a dead Hermes may answer JSON of its own."""
    if status not in _PROXY_FAILURES:
        return True
    payload = parse_json_object(body)
    if payload is None:
        return False
    error = payload.get("error")
    return (isinstance(error, dict) and isinstance(error.get("message"), str)) or isinstance(payload.get("run_id"), str)


#: aiohttp writes a bytes body in one go and warns past this size; a stream of one is written in chunks.
_LARGE_BODY = 2**20


def _payload(body: bytes | None) -> bytes | io.BytesIO | None:
    return io.BytesIO(body) if body is not None and len(body) > _LARGE_BODY else body


def _maybe_sent(exc: BaseException) -> bool:
    """Could the request have reached Hermes before the failure? Not when the connection was never made."""
    return not isinstance(exc, aiohttp.ClientConnectorError | ConnectionRefusedError)


def _unreachable(exc: BaseException) -> str:
    """A short sentence for a failed call (SPEC S3.2 `hold.detail`); never the exception's raw text."""
    if isinstance(exc, aiohttp.ClientConnectorError | ConnectionRefusedError):
        return "Hermes refused the connection."
    if isinstance(exc, aiohttp.ServerDisconnectedError | ConnectionResetError):
        return "Hermes closed the connection."
    return f"Hermes could not be reached ({type(exc).__name__})."


def _route(path: str) -> str:
    """A metric label for a path: run ids replaced, so the label set stays small."""
    parts = path.split("/")
    if len(parts) > 3 and parts[1:3] == ["v1", "runs"]:
        parts[3] = "{id}"
    return "/".join(parts)


def _run_path(run_id: str, suffix: str = "") -> str:
    return f"/v1/runs/{quote(run_id, safe='')}{suffix}"
