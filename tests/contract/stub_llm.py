"""A tiny OpenAI-compatible chat-completions server that stands in for the LLM behind a real Hermes.

Markers in the last user message script the agent's model calls (only calls that offer tools, i.e. the agent's
own turns; auxiliary calls such as titles always get the plain answer at once):

- `sleep:N`: the answer is streamed over N seconds;
- `fail:NNN`: the call answers HTTP NNN (use a 4xx: Hermes retries 5xx);
- `approval`: the first turn calls the `terminal` tool with `rm -rf <scratch dir>`, which Hermes gates;
- `tools:K`: the first K turns call `terminal` with a harmless `echo`.

With a third argument (a file path) every agent call is logged there as one JSON line: when it began and ended
(epoch seconds) and the messages it got (the contract tests read what the LLM saw of a conversation).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import Iterator
from typing import Any

from aiohttp import web

ANSWER = ("Hello ", "from ", "the ", "stub ", "LLM.")
USAGE = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}

scratch_key = web.AppKey("scratch", str)
calls_key = web.AppKey("calls", str)


def create_app(scratch_dir: str, calls_path: str = "") -> web.Application:
    """`scratch_dir` is what the `approval` marker asks the agent to delete (it survives a deny); `calls_path`: where
    agent calls are logged ('': nowhere)."""
    app = web.Application()
    app[scratch_key] = scratch_dir
    app[calls_key] = calls_path
    app.router.add_post("/v1/chat/completions", _chat)
    app.router.add_get("/v1/models", _models)
    return app


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "stub-model", "object": "model", "owned_by": "stub"}]})


async def _chat(request: web.Request) -> web.StreamResponse:
    began = time.time()
    body = await request.json()
    try:
        return await _answer(request, body)
    finally:
        path = request.app[calls_key]
        if path and body.get("tools"):
            with open(path, "a") as calls:
                calls.write(json.dumps({"start": began, "end": time.time(), "messages": body.get("messages")}) + "\n")


async def _answer(request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
    messages: list[dict[str, Any]] = body.get("messages") or []
    text = _last_user_text(messages)
    agent_turn = bool(body.get("tools"))
    failure = re.search(r"\bfail:(\d{3})\b", text)
    if agent_turn and failure:
        status = int(failure.group(1))
        error = {"message": f"stub forced {status}", "type": "invalid_request_error", "code": None}
        return web.json_response({"error": error}, status=status)
    command = _tool_command(text, messages, request.app[scratch_key]) if agent_turn else None
    sleep = re.search(r"\bsleep:(\d+(?:\.\d+)?)", text)
    pause = float(sleep.group(1)) / len(ANSWER) if agent_turn and sleep else 0.0
    if body.get("stream"):
        return await _stream(request, command, pause)
    if pause:
        await asyncio.sleep(pause * len(ANSWER))
    return web.json_response(_completion(command))


def _last_user_text(messages: list[dict[str, Any]]) -> str:
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
            return str(content or "")
    return ""


def _tool_command(text: str, messages: list[dict[str, Any]], scratch: str) -> str | None:
    """The command of this turn's tool call, or None when the model should answer."""
    done = 0
    for message in reversed(messages):
        if message.get("role") == "user":
            break
        done += message.get("role") == "tool"
    if re.search(r"\bapproval\b", text) and done == 0:
        return f"rm -rf {scratch}"
    tools = re.search(r"\btools:(\d+)", text)
    if tools and done < int(tools.group(1)):
        return f"echo step {done + 1}"
    return None


def _tool_call(command: str) -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {
        "id": f"call_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": "terminal", "arguments": arguments},
    }


def _completion(command: str | None) -> dict[str, Any]:
    if command is None:
        message: dict[str, Any] = {"role": "assistant", "content": "".join(ANSWER)}
        finish = "stop"
    else:
        message = {"role": "assistant", "content": None, "tool_calls": [_tool_call(command)]}
        finish = "tool_calls"
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": "stub-model",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": USAGE,
    }


async def _stream(request: web.Request, command: str | None, pause: float) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    try:
        for chunk in _chunks(command):
            if pause and "content" in chunk["choices"][0]["delta"]:
                await asyncio.sleep(pause)  # a disconnecting agent (stop) makes the next write fail
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
    except ConnectionError:
        pass
    return response


def _chunks(command: str | None) -> Iterator[dict[str, Any]]:
    base = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "model": "stub-model"}
    yield {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
    if command is None:
        for part in ANSWER:
            yield {**base, "choices": [{"index": 0, "delta": {"content": part}, "finish_reason": None}]}
        finish = "stop"
    else:
        call = {"index": 0, **_tool_call(command)}
        yield {**base, "choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}]}
        finish = "tool_calls"
    yield {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]}
    yield {**base, "choices": [], "usage": USAGE}


if __name__ == "__main__":
    import sys

    scratch = sys.argv[2] if len(sys.argv) > 2 else "/tmp/stub-scratch"
    web.run_app(create_app(scratch, sys.argv[3] if len(sys.argv) > 3 else ""), port=int(sys.argv[1]))
