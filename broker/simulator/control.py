"""The `/_sim/` control API: faults, settings and the request log for tests. Never part of Hermes."""

from __future__ import annotations

import time

import attrs
import orjson
from aiohttp import web

from broker.simulator.state import Settings, Simulator
from broker.simulator.wire import JsonObject

CONTROL_PREFIX = "/_sim/"
simulator_key = web.AppKey("simulator", Simulator)
request_key = web.RequestKey("request_log_entry", dict)


def add_control_routes(app: web.Application) -> None:
    app.router.add_get("/_sim/settings", _get_settings)
    app.router.add_post("/_sim/settings", _set_settings)
    app.router.add_post("/_sim/restart", _restart)
    app.router.add_post("/_sim/refuse", _refuse)
    app.router.add_post("/_sim/runs/{run_id}/interrupt", _interrupt)
    app.router.add_post("/_sim/runs/{run_id}/touch", _touch)
    app.router.add_get("/_sim/requests", _requests)
    app.router.add_delete("/_sim/requests", _clear_requests)
    app.router.add_get("/_sim/stats", _stats)
    app.router.add_delete("/_sim/stats", _reset_stats)


async def _get_settings(request: web.Request) -> web.Response:
    return web.json_response(_public(request.app[simulator_key].settings))


async def _set_settings(request: web.Request) -> web.Response:
    """Change any of the settings' fields, e.g. `{"busy": true}`, `{"delay_s": 2}`, `{"upstream_main": true}`."""
    settings = request.app[simulator_key].settings
    body = await _body(request)
    fields = attrs.fields_dict(Settings)
    for name, value in body.items():
        if name not in fields:
            raise _bad(f"unknown setting {name!r}")
        current = getattr(settings, name)
        if isinstance(current, bool) != isinstance(value, bool) or not _same_kind(current, value):
            raise _bad(f"setting {name!r} needs a value like {current!r}")
        setattr(settings, name, value)
    return web.json_response(_public(settings))


async def _restart(request: web.Request) -> web.Response:
    """`{"cancel": false, "down_s": 0}`: forget every run; `cancel` ends live runs as a SIGTERM does."""
    body = await _body(request)
    await request.app[simulator_key].restart(cancel=body.get("cancel") is True, down_s=_seconds(body, "down_s"))
    return web.json_response({"restarted": True})


async def _refuse(request: web.Request) -> web.Response:
    """`{"seconds": N}`: drop every /v1 and /health connection for N seconds (0 ends it)."""
    sim = request.app[simulator_key]
    sim.refuse_until = time.monotonic() + _seconds(await _body(request), "seconds")
    for run in sim.runs.values():
        if run.stream is not None:
            run.stream.drop_subscribers()
    return web.json_response({"refusing": sim.refusing()})


async def _interrupt(request: web.Request) -> web.Response:
    """`{"forget": false}`: break the run's event stream mid-way; `forget` also drops the run (404 from now on)."""
    sim = request.app[simulator_key]
    run_id = request.match_info["run_id"]
    run = sim.runs.get(run_id)
    if run is None:
        raise web.HTTPNotFound(text=f"no run {run_id}")
    if run.stream is not None:
        run.stream.drop_subscribers()
        run.stream = None
    if (await _body(request)).get("forget") is True:
        if run.task is not None:
            run.task.cancel()
        del sim.runs[run_id]
    return web.json_response({"interrupted": run_id})


async def _touch(request: web.Request) -> web.Response:
    """Rewrite the run's `updated_at` without any activity, as Hermes sometimes does."""
    run = request.app[simulator_key].runs.get(request.match_info["run_id"])
    if run is None:
        raise web.HTTPNotFound(text="no such run")
    run.updated_at = time.time()
    return web.json_response(run.to_api())


async def _requests(request: web.Request) -> web.Response:
    """Every /v1 and /health request so far: method, path, idempotency_key, traceparent, status."""
    return web.json_response({"requests": request.app[simulator_key].requests})


async def _clear_requests(request: web.Request) -> web.Response:
    request.app[simulator_key].requests.clear()
    return web.json_response({"requests": []})


async def _stats(request: web.Request) -> web.Response:
    """Live runs now and at most, runs known and settled, and creates answered by status (for benchmarks)."""
    return web.json_response(request.app[simulator_key].stats())


async def _reset_stats(request: web.Request) -> web.Response:
    sim = request.app[simulator_key]
    sim.reset_stats()
    return web.json_response(sim.stats())


async def _body(request: web.Request) -> JsonObject:
    raw = await request.read()
    if not raw:
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise _bad("body must be JSON") from None
    if not isinstance(value, dict):
        raise _bad("body must be a JSON object")
    return value


def _seconds(body: JsonObject, name: str) -> float:
    value = body.get(name, 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise _bad(f"{name} must be a number of seconds")
    return float(value)


def _same_kind(current: object, value: object) -> bool:
    if isinstance(current, float):
        return isinstance(value, int | float)
    if current is None or isinstance(current, str):
        return value is None or isinstance(value, str)
    return type(value) is type(current)


def _public(settings: Settings) -> JsonObject:
    return attrs.asdict(settings, filter=lambda field, _: field.name != "api_key")


def _bad(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=orjson.dumps({"error": message}).decode(), content_type="application/json")
