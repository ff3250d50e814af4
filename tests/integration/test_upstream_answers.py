"""What counts as an answer of an upstream (SPEC S10), as the Hermes client records it over real HTTP on loopback:
a refused connection, a timeout and a proxy's HTML 502 are failures; a timed-out create's answer was lost (its run
may be live), a refused one's was not."""

from __future__ import annotations

import asyncio

from aiohttp import web
from aiohttp.test_utils import TestServer

from broker.hermes import AiohttpHermesClient, Unavailable
from tests.conftest import free_port


async def test_refusals_timeouts_and_a_proxys_502_are_failures_and_only_a_sent_create_is_unanswered() -> None:
    async def proxy_down(_: web.Request) -> web.Response:
        return web.Response(status=502, text="<html>Bad Gateway</html>", content_type="text/html")

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.json_response({"run_id": "run_1", "status": "started"}, status=202)

    app = web.Application()
    app.router.add_get("/v1/runs/{run_id}", proxy_down)
    app.router.add_post("/v1/runs", slow)
    server = TestServer(app)
    await server.start_server()
    try:
        behind_proxy = AiohttpHermesClient(str(server.make_url("")).rstrip("/"), None, 500)
        await behind_proxy.get("run_1")
        assert behind_proxy.heard.failing  # no Hermes answered: a proxy in front of a dead one
        timed_out = await behind_proxy.create(b'{"input": "hi"}', idempotency_key="job_1")
        assert isinstance(timed_out, Unavailable) and timed_out.unanswered  # the run may be live there
        await behind_proxy.aclose()
        nobody = AiohttpHermesClient(f"http://127.0.0.1:{free_port()}", None, 500)
        refused = await nobody.create(b'{"input": "hi"}', idempotency_key="job_1")
        assert isinstance(refused, Unavailable) and not refused.unanswered  # it never got there
        assert nobody.heard.failing and nobody.heard.answered_ms == 0
        await nobody.aclose()
    finally:
        await server.close()
