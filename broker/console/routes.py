"""The operator console (SPEC S8): server-rendered pages from the broker's own app, a served script and
stylesheet (no inline code, no external assets), `Content-Security-Policy: default-src 'self'`."""

from __future__ import annotations

from importlib import resources
from typing import Any

import jinja2
from aiohttp import web

from broker.console import data
from broker.console.usage import usage_page
from broker.http import appkeys
from broker.ids import JOB_PREFIX

SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
STATIC = {"console.js": "text/javascript", "console.css": "text/css"}

templates_key = web.AppKey("console_templates", jinja2.Environment)


def _environment() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("broker.console", "templates"),
        autoescape=True,  # every value is escaped; nothing is marked safe
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["when"] = data.when
    environment.filters["shown"] = data.shown_value
    return environment


def _page(request: web.Request, template: str, context: dict[str, Any], http_status: int = 200) -> web.Response:
    body = request.app[templates_key].get_template(template).render(**context)
    headers = SECURITY_HEADERS
    return web.Response(text=body, status=http_status, content_type="text/html", charset="utf-8", headers=headers)


async def overview(request: web.Request) -> web.Response:
    return _page(request, "overview.html", await data.overview(request.app, request.query))


async def job(request: web.Request) -> web.Response:
    job_id = request.match_info["job_id"]
    snapshot = await request.app[appkeys.store_key].load(job_id) if job_id.startswith(JOB_PREFIX) else None
    if snapshot is None:
        return _page(request, "not_found.html", {"job_id": job_id}, http_status=404)
    return _page(request, "job.html", await data.job_page(request.app, snapshot))


async def usage(request: web.Request) -> web.Response:
    return _page(request, "usage.html", await usage_page(request.app))


async def static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in STATIC:
        raise web.HTTPNotFound()
    body = resources.files("broker.console").joinpath("static", name).read_bytes()
    return web.Response(body=body, content_type=STATIC[name], charset="utf-8", headers=SECURITY_HEADERS)


def register(app: web.Application) -> None:
    app[templates_key] = _environment()
    app.router.add_get("/console", overview)
    app.router.add_get("/console/jobs/{job_id}", job)
    app.router.add_get("/console/usage", usage)
    app.router.add_get("/console/static/{name}", static)
