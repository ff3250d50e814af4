"""Thin handlers for /v1/runs: parse -> service -> render. No Redis, no Hermes here."""

from __future__ import annotations

from aiohttp import web

from broker import tracing
from broker.errors import JobNotFound
from broker.http import appkeys as keys
from broker.http.callbacks import callback_documents
from broker.http.crosssite import same_site_only
from broker.http.errors import envelope
from broker.http.proxy import proxy_or_not_found
from broker.http.render import job_object, json_response
from broker.http.schemas import parse_approval, parse_create
from broker.ids import JOB_PREFIX

_CREATE_ATTRIBUTES = {"http.request.method": "POST", "http.route": "/v1/runs"}


@same_site_only
async def create_run(request: web.Request) -> web.Response:
    caller = request.headers.get("traceparent")  # the job's trace continues the caller's (SPEC S6.1)
    with tracing.start(tracing.CREATE, parent=caller, kind=tracing.Kind.SERVER, attributes=_CREATE_ATTRIBUTES) as span:
        config = request.app[keys.config_key]
        run = parse_create(
            await request.read(),
            request.headers,
            max_body=config.hermes_max_body,
            callback_hosts=config.callback_allowed_hosts,
        )
        result = await request.app[keys.service_key].create(run, traceparent=span.traceparent)
        span.set(tracing.JOB, result.view.job_id)
        span.set("job.replayed", result.replayed)
        span.set("http.response.status_code", 202)
    headers = {"Idempotency-Replayed": "true"} if result.replayed else None
    service = request.app[keys.service_key]
    owner = (await service.owners([result.view]))[0] if result.replayed else None  # a new job: no driver yet
    callback = (await callback_documents(request.app, [result.view])).get(result.view.job_id)
    return json_response(
        {**job_object(result.view, keys.first_upstream(request.app), owner, callback), "replayed": result.replayed},
        status=202,
        headers=headers,
    )


async def get_run(request: web.Request) -> web.StreamResponse:
    run_id = request.match_info["run_id"]
    if not run_id.startswith(JOB_PREFIX):
        return await proxy_or_not_found(request, run_id)  # not a broker id: no Redis lookup
    service = request.app[keys.service_key]
    try:
        view = await service.get(run_id)
    except JobNotFound:
        return await proxy_or_not_found(request, run_id)
    (owner,) = await service.owners([view])
    callback = (await callback_documents(request.app, [view])).get(view.job_id)
    return json_response(job_object(view, keys.first_upstream(request.app), owner, callback))


@same_site_only
async def stop_run(request: web.Request) -> web.StreamResponse:
    run_id = request.match_info["run_id"]
    try:
        view = await request.app[keys.service_key].stop(run_id, caller=request.headers.get("traceparent"))
    except JobNotFound:
        return await proxy_or_not_found(request, run_id, "/stop")
    return json_response({"run_id": view.job_id, "status": view.status.value})


@same_site_only
async def approve_run(request: web.Request) -> web.StreamResponse:
    run_id = request.match_info["run_id"]
    service = request.app[keys.service_key]
    try:
        await service.get(run_id)  # an unknown job is a 404 (or Hermes's run) before its body is judged
    except JobNotFound:
        return await proxy_or_not_found(request, run_id, "/approval")
    allow_always = request.app[keys.config_key].runs_approval_allow_always
    choice = parse_approval(await request.read(), allow_always=allow_always)
    status, payload = await service.approve(run_id, choice, caller=request.headers.get("traceparent"))
    return json_response(payload, status=status)


async def not_found(request: web.Request) -> web.Response:
    return envelope(404, "Not found", code="not_found")


def register(app: web.Application) -> None:
    app.router.add_route("*", "/v1/runs/reviews", not_found)  # removed endpoint: 404 whatever the method
    app.router.add_post("/v1/runs", create_run)
    app.router.add_get("/v1/runs/{run_id}", get_run)
    app.router.add_post("/v1/runs/{run_id}/stop", stop_run)
    app.router.add_post("/v1/runs/{run_id}/approval", approve_run)
