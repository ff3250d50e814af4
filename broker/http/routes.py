"""Thin handlers for /v1/runs: parse -> service -> render. No Redis, no Hermes here."""

from __future__ import annotations

from aiohttp import web

from broker.http import appkeys as keys
from broker.http.errors import envelope
from broker.http.render import job_object
from broker.http.schemas import CreateRun


async def create_run(request: web.Request) -> web.Response:
    run = CreateRun.from_request(await request.read(), request.headers)
    result = await request.app[keys.service_key].create(run)
    headers = {"Idempotency-Replayed": "true"} if result.replayed else None
    return web.json_response({**job_object(result.view), "replayed": result.replayed}, status=202, headers=headers)


async def get_run(request: web.Request) -> web.Response:
    view = await request.app[keys.service_key].get(request.match_info["run_id"])
    return web.json_response(job_object(view))


async def not_found(request: web.Request) -> web.Response:
    return envelope(404, "Not found.", code="not_found")


def register(app: web.Application) -> None:
    app.router.add_route("*", "/v1/runs/reviews", not_found)  # removed endpoint: 404 whatever the method
    app.router.add_post("/v1/runs", create_run)
    app.router.add_get("/v1/runs/{run_id}", get_run)
