"""A local OTLP/HTTP receiver that discards every trace, for the tracing row: the broker's export costs what it
costs against a collector that answers at once.

PORT=... python scripts/bench_baselines/otlp_sink.py      (GET /count -> {"requests": n, "bytes": b})
"""

from __future__ import annotations

import os

from aiohttp import web

received = web.AppKey("received", list)


async def traces(request: web.Request) -> web.Response:
    body = await request.read()
    request.app[received][0] += 1
    request.app[received][1] += len(body)
    # an empty ExportTraceServiceResponse: no partial success to report
    return web.Response(body=b"", content_type="application/x-protobuf")


async def count(request: web.Request) -> web.Response:
    requests, size = request.app[received]
    return web.json_response({"requests": requests, "bytes": size})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


if __name__ == "__main__":
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[received] = [0, 0]
    app.router.add_post("/v1/traces", traces)
    app.router.add_get("/count", count)
    app.router.add_get("/healthz", healthz)
    web.run_app(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=None, print=None)
