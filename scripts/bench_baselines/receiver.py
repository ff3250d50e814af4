"""A dummy board receiver for the memory row: answers 200 to every report and counts them.

PORT=... python scripts/bench_baselines/receiver.py      (GET /count -> {"received": n})
"""

from __future__ import annotations

import os

from aiohttp import web

received = web.AppKey("received", list)


async def report(request: web.Request) -> web.Response:
    await request.read()
    request.app[received][0] += 1
    return web.json_response({"ok": True})


async def count(request: web.Request) -> web.Response:
    return web.json_response({"received": request.app[received][0]})


if __name__ == "__main__":
    app = web.Application()
    app[received] = [0]
    app.router.add_post("/", report)
    app.router.add_get("/count", count)
    web.run_app(app, host="127.0.0.1", port=int(os.environ["PORT"]), access_log=None, print=None)
