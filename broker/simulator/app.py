"""The simulator's aiohttp app: Hermes 0.19.0's `/v1/runs` routes, `/health`, and the `/_sim/` control API."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web

from broker.simulator.bodies import BodyError, parse_choice, parse_create, parse_object
from broker.simulator.control import CONTROL_PREFIX, add_control_routes, request_key, simulator_key
from broker.simulator.limits import MAX_REQUEST_BYTES, refused_body, too_large
from broker.simulator.script import Script, play
from broker.simulator.state import RunStream, Settings, SimRun, Simulator
from broker.simulator.wire import JsonObject

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
HEALTH = {"status": "ok", "platform": "hermes-agent", "version": "0.19.0"}
MAX_SESSION_KEY = 256
NO_KEY_FOR_SESSION_KEY = (
    "X-Hermes-Session-Key requires API key authentication. Configure API_SERVER_KEY to enable this feature."
)


def create_app(settings: Settings | None = None) -> web.Application:
    """A fresh simulated Hermes; `app[simulator_key]` is its state for in-process tests."""
    app = web.Application(middlewares=[_edge], client_max_size=MAX_REQUEST_BYTES)
    app[simulator_key] = Simulator(settings or Settings())
    app.router.add_get("/health", _health)
    app.router.add_post("/v1/runs", _create)
    app.router.add_get("/v1/runs/{run_id}", _get)
    app.router.add_get("/v1/runs/{run_id}/events", _events)
    app.router.add_post("/v1/runs/{run_id}/stop", _stop)
    app.router.add_post("/v1/runs/{run_id}/approval", _approval)
    add_control_routes(app)
    app.cleanup_ctx.append(_cancel_runs_on_exit)
    return app


def error(status: int, message: str, code: str | None = None, **kwargs: object) -> web.Response:
    """Hermes's error envelope (`param` is always null on the runs routes)."""
    envelope = {"message": message, "type": kwargs.pop("type", "invalid_request_error"), "param": None, "code": code}
    return web.json_response({"error": envelope}, status=status, **kwargs)  # type: ignore[arg-type]


def not_found(run_id: str) -> web.Response:
    return error(404, f"Run not found: {run_id}", "run_not_found")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _edge(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Faults, the request log and auth, in that order, for everything outside the control API."""
    sim = request.app[simulator_key]
    if request.path.startswith(CONTROL_PREFIX):
        return await handler(request)
    entry: JsonObject = {"method": request.method, "path": request.path, "status": None}
    entry["idempotency_key"] = request.headers.get("Idempotency-Key")
    entry["traceparent"] = request.headers.get("traceparent")  # W3C trace context, for tracing tests
    entry["session_key"] = request.headers.get("X-Hermes-Session-Key")  # as Hermes decodes it (UTF-8)
    sim.requests.append(entry)  # dropped connections stay in the log with status null
    request[request_key] = entry
    if sim.refusing() and request.transport is not None:
        request.transport.abort()  # the client sees its connection dropped, as with a Hermes that is down
        raise asyncio.CancelledError
    if sim.settings.delay_s > 0:
        await asyncio.sleep(sim.settings.delay_s)
    refused = refused_body(request, sim.settings) or (_refuse_key(request) if request.path.startswith("/v1/") else None)
    try:
        response = refused if refused is not None else await handler(request)
    except web.HTTPRequestEntityTooLarge:  # a body without Content-Length over client_max_size, as Hermes answers it
        response = too_large()
    entry["status"] = response.status
    if request.method == "POST" and request.path == "/v1/runs":
        sim.count_create(response.status)
    return response


def _refuse_key(request: web.Request) -> web.Response | None:
    api_key = request.app[simulator_key].settings.api_key
    if not api_key:
        return None
    header = request.headers.get("Authorization", "")
    token = header[7:].strip() if header.startswith("Bearer ") else ""
    if token and hmac.compare_digest(token.encode(), api_key.encode()):
        return None
    envelope = {"message": "Invalid API key", "type": "invalid_request_error", "code": "invalid_api_key"}
    return web.json_response({"error": envelope}, status=401)  # this one envelope has no `param`


async def _health(request: web.Request) -> web.Response:
    return web.json_response(HEALTH)


async def _create(request: web.Request) -> web.Response:
    sim = request.app[simulator_key]
    settings = sim.settings
    if settings.draining:
        return error(503, "Gateway is draining existing work; retry shortly.", "gateway_draining", headers=_RETRY)
    session_key = request.headers.get("X-Hermes-Session-Key", "").strip()
    if session_key and not settings.api_key:
        return error(403, NO_KEY_FOR_SESSION_KEY)
    if len(session_key) > MAX_SESSION_KEY:
        return web.json_response(
            {"error": {"message": "Session key too long", "type": "invalid_request_error"}}, status=400
        )
    body = await request.read()
    key = request.headers.get("Idempotency-Key") if settings.upstream_main else None
    fingerprint = hashlib.sha256(body + b"\0" + session_key.encode()).hexdigest()
    if key is not None:
        if not 1 <= len(key) <= 255 or not all(33 <= ord(c) <= 126 for c in key):
            return error(400, "Idempotency-Key must be 1-255 visible ASCII characters.", "invalid_idempotency_key")
        if (known := sim.idempotency.get(key)) is not None:
            return _replay(sim, known, fingerprint)
    if settings.busy or 0 < settings.max_concurrent <= sim.active_count():
        message = f"Too many concurrent runs (max {settings.max_concurrent})"
        return error(429, message, "rate_limit_exceeded", type="rate_limit_error", headers=_RETRY)
    try:
        parsed = parse_create(body)
    except BodyError as exc:
        return error(400, exc.message, exc.code)
    request[request_key]["conversation_history"] = given_history(body)  # what the run was given (tests read it)
    run = sim.new_run(session_id=parsed.session_id, model=parsed.model, idempotency_key=key)
    if key is not None:
        sim.idempotency[key] = (fingerprint, run.run_id)
    run.task = asyncio.create_task(play(run, Script.from_text(parsed.text), settings))
    request[request_key]["run_id"] = run.run_id  # the request log tells which creates started a run
    answer: JsonObject = {"run_id": run.run_id, "status": "started"}
    if settings.upstream_main:
        answer["replayed"] = False
    return web.json_response(answer, status=202, headers={"X-Hermes-Session-Key": session_key} if session_key else None)


def _replay(sim: Simulator, known: tuple[str, str], fingerprint: str) -> web.Response:
    stored_fingerprint, run_id = known
    if stored_fingerprint != fingerprint:
        message = "Idempotency-Key was already used with a different request body."
        return error(409, message, "idempotency_key_conflict")
    run = sim.runs.get(run_id)
    answer = {"run_id": run_id, "status": run.status if run else "started", "replayed": True}
    return web.json_response(answer, status=202, headers={"Idempotency-Replayed": "true"})


async def _get(request: web.Request) -> web.Response:
    run_id = request.match_info["run_id"]
    run = request.app[simulator_key].runs.get(run_id)
    return web.json_response(run.to_api()) if run else not_found(run_id)


async def _events(request: web.Request) -> web.StreamResponse:
    sim = request.app[simulator_key]
    run_id = request.match_info["run_id"]
    found = await _wait_for_stream(sim, run_id)
    if found is None or request.transport is None:
        return not_found(run_id)
    run, stream = found
    response = web.StreamResponse(status=200, headers=SSE_HEADERS)
    await response.prepare(request)
    request[request_key]["status"] = 200
    transport = request.transport
    stream.transports.add(transport)
    try:
        while True:
            try:
                event = await asyncio.wait_for(stream.queue.get(), sim.settings.keepalive_s)
            except TimeoutError:
                await response.write(b": keepalive\n\n")
                continue
            if event is None:
                await response.write(b": stream closed\n\n")
                break
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
    except (ConnectionError, RuntimeError):
        pass  # the subscriber went away; as in Hermes, that drops the buffer
    finally:
        stream.transports.discard(transport)
        if run.stream is stream:
            run.stream = None
    return response


async def _wait_for_stream(sim: Simulator, run_id: str) -> tuple[SimRun, RunStream] | None:
    """Hermes waits about a second for a run to register before it answers 404."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + sim.settings.events_wait_s
    while True:
        run = sim.runs.get(run_id)
        if run is not None and run.stream is not None:
            return run, run.stream
        if loop.time() >= deadline:
            return None
        await asyncio.sleep(0.05)


async def _stop(request: web.Request) -> web.Response:
    sim = request.app[simulator_key]
    run_id = request.match_info["run_id"]
    run = sim.runs.get(run_id)
    if run is None or run.task is None or run.task.done():
        if run is not None and sim.settings.upstream_main:
            if run.status == "interrupted":  # a survivor of a restart: not alive in this process
                return error(409, f"Run is not active in this process: {run_id}", "run_not_active")
            return web.json_response({"run_id": run_id, "status": run.status})
        return not_found(run_id)
    run.set_status("stopping", last_event="run.stopping")
    if not run.stopping:
        run.stopping = True
        # Hermes interrupts cooperatively: the run reads `stopping` for a moment before it settles.
        asyncio.get_running_loop().call_later(sim.settings.step_s, run.task.cancel)
    return web.json_response({"run_id": run_id, "status": "stopping"})


async def _approval(request: web.Request) -> web.Response:
    sim = request.app[simulator_key]
    run_id = request.match_info["run_id"]
    run = sim.runs.get(run_id)
    if run is None:
        return not_found(run_id)
    try:
        choice, _ = parse_choice(parse_object(await request.read()))
    except BodyError as exc:
        return error(400, exc.message, exc.code)
    if run.task is None or run.task.done():
        return error(409, f"Run has no active approval session: {run_id}", "approval_not_active")
    if run.approval is None or run.approval.done():
        return error(409, f"Run has no pending approval: {run_id}", "approval_not_pending")
    run.approval.set_result(choice)  # the simulator has one prompt at a time, so `all` resolves the same one
    run.set_status("running", last_event="approval.responded")
    run.emit("approval.responded", choice=choice, resolved=1)
    return web.json_response(
        {"object": "hermes.run.approval_response", "run_id": run_id, "choice": choice, "resolved": 1}
    )


async def _cancel_runs_on_exit(app: web.Application) -> AsyncIterator[None]:
    yield
    sim = app[simulator_key]
    tasks = [run.task for run in sim.runs.values() if run.task is not None and not run.task.done()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


_RETRY = {"Retry-After": "1"}


def given_history(body: bytes) -> object:
    """The create's `conversation_history` as it came (None when absent), for the request log."""
    payload = json.loads(body)
    return payload.get("conversation_history") if isinstance(payload, dict) else None
