"""The create ceiling: a bare aiohttp app doing what the broker's create must do, and nothing else.

    BENCH_REDIS_URL=redis://... PORT=... python scripts/bench_baselines/ceiling.py

orjson, hand validation of the create body (input, instructions, session_id, model, context, reporting,
Idempotency-Key), a job id from the key, and ONE Lua script with the broker's create writes (see
broker/store/scripts/append_events.lua): refuse an existing job, XADD the event, HSET the view, PEXPIRE both,
XADD a work doorbell, ZADD the due schedule. Its own key prefix (`ceil:`), never the broker's keys.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from urllib.parse import urlsplit

import orjson
from aiohttp import web
from redis.asyncio import Redis

CREATE = """
if redis.call('HGET', KEYS[2], 'last_id') then
  return {'EXISTS', redis.call('HGET', KEYS[2], 'state')}
end
local id = redis.call('XADD', KEYS[1], '*', 'e', ARGV[1])
redis.call('HSET', KEYS[2], 'state', ARGV[2], 'last_id', id)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', 100000, '*', 'job', ARGV[4])
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[4])
return {'OK', id}
"""
RETENTION_MS = 604_800_000
FORWARDED = ("input", "instructions", "conversation_history", "previous_response_id", "session_id", "model")


class Invalid(Exception):
    def __init__(self, code: str, message: str) -> None:
        self.code, self.message = code, message


def bad(status: int, code: str, message: str) -> web.Response:
    envelope = {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}}
    return web.Response(body=orjson.dumps(envelope), status=status, content_type="application/json")


def check_url(value: object, path: str) -> None:
    if not isinstance(value, str) or len(value) > 2048:
        raise Invalid("invalid_context", f"{path} must be an http or https URL")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.username or parts.password:
        raise Invalid("invalid_context", f"{path} must be an http or https URL")


def check_context(context: object) -> None:
    if not isinstance(context, dict):
        raise Invalid("invalid_context", "context must be an object")
    title = context.get("title")
    if not isinstance(title, str) or not 1 <= len(title) <= 500 or not title.strip():
        raise Invalid("invalid_context", "context.title must be a non-blank string of 1-500 characters")
    if "url" in context:
        check_url(context["url"], "context.url")
    links = context.get("links", [])
    if not isinstance(links, list) or len(links) > 10:
        raise Invalid("invalid_context", "context.links must be an array of at most 10 links")
    for index, link in enumerate(links):
        text = link.get("text") if isinstance(link, dict) else None
        if not isinstance(text, str) or not 1 <= len(text) <= 100 or not text.strip():
            raise Invalid("invalid_context", f"context.links[{index}].text must be a non-blank string")
        check_url(link.get("url"), f"context.links[{index}].url")


def check_body(body: object) -> dict[str, object]:
    if not isinstance(body, dict):
        raise Invalid("invalid_json", "The body must be a JSON object.")
    value = body.get("input")
    if value is None or value == [] or (isinstance(value, str) and not value.strip()):
        raise Invalid("missing_input", "input is required")
    if not isinstance(value, str | list):
        raise Invalid("invalid_input", "input must be a string or an array of messages")
    for name in ("instructions", "previous_response_id", "model"):
        if name in body and not isinstance(body[name], str):
            raise Invalid("invalid_field", f"{name} must be a string")
    session = body.get("session_id")
    if session is not None and (not isinstance(session, str) or not 1 <= len(session) <= 256):
        raise Invalid("invalid_field", "session_id must be a string of 1-256 characters")
    if "context" in body:
        check_context(body["context"])
    reporting = body.get("reporting", {})
    if not isinstance(reporting, dict) or any(not isinstance(flag, bool) for flag in reporting.values()):
        raise Invalid("invalid_reporting", "reporting must be an object of booleans")
    return {name: body[name] for name in FORWARDED if name in body}


def job_id(key: str | None) -> str:
    if key is None:
        return "job_" + secrets.token_hex(16)
    if not 1 <= len(key) <= 255 or not all(33 <= ord(char) <= 126 for char in key):
        raise Invalid("invalid_idempotency_key", "Idempotency-Key must be 1-255 visible ASCII characters.")
    return "job_" + hashlib.sha256(key.encode()).hexdigest()[:32]


def make_app(redis: Redis) -> web.Application:
    script = redis.register_script(CREATE)

    async def create(request: web.Request) -> web.Response:
        try:
            job = job_id(request.headers.get("Idempotency-Key"))
            body = orjson.loads(await request.read())
            execution = check_body(body)
        except orjson.JSONDecodeError:
            return bad(400, "invalid_json", "The body is not JSON.")
        except Invalid as error:
            return bad(400, error.code, error.message)
        now = time.time()
        view = {"object": "hermes.run", "run_id": job, "status": "queued", "created_at": now, "updated_at": now,
                "session_id": execution.get("session_id"), "model": "hermes-agent", "attempts": 0,
                "hermes_run_id": None, "hold": None, "output": None, "usage": None, "error": None,
                "context": body.get("context"), "reporting": {"board": True, "post": True}}  # fmt: skip
        event = {"type": "job.queued", "job_id": job, "at_ms": int(now * 1000), "execution": execution,
                 "context": body.get("context")}  # fmt: skip
        keys = [f"ceil:{{{job}}}:events", f"ceil:{{{job}}}:view", "ceil:work", "ceil:due"]
        due = int(now * 1000) + 15_000
        reply = await script(keys=keys, args=[orjson.dumps(event), orjson.dumps(view), RETENTION_MS, job, due])
        replayed = reply[0] != b"OK"
        answer = orjson.loads(reply[1]) if replayed else view
        return web.Response(body=orjson.dumps({**answer, "replayed": replayed}), status=202,
                            content_type="application/json")  # fmt: skip

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application(client_max_size=10_000_000)
    app.router.add_post("/v1/runs", create)
    app.router.add_get("/healthz", health)
    return app


if __name__ == "__main__":
    redis = Redis.from_url(os.environ["BENCH_REDIS_URL"], max_connections=256)
    web.run_app(make_app(redis), host="127.0.0.1", port=int(os.environ["PORT"]), access_log=None, print=None)
