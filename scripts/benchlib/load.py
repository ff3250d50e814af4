"""HTTP load: the create body, `wrk` with a Lua script when installed, else an aiohttp client."""

from __future__ import annotations

import asyncio
import itertools
import re
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import aiohttp
import orjson

from benchlib.figures import percentile

T = TypeVar("T")
R = TypeVar("R")
LINKS = [("Pipeline #88412", "https://ci.example.com/group/payments-service/-/pipelines/88412"),
         ("Merge request !1234", "https://git.example.com/group/payments-service/-/merge_requests/1234"),
         ("Runbook", "https://wiki.example.com/ops/runbooks/payments-service/staging-promotion")]  # fmt: skip
WRK_SCRIPT = """
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end
local n = 0
local prefix = "k"
function init(args)
  prefix = args[1]
  local file = io.open(args[2], "rb")
  wrk.body = file:read("*a")
  file:close()
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
end
function request()
  n = n + 1
  wrk.headers["Idempotency-Key"] = prefix .. "-" .. tid .. "-" .. n
  return wrk.format(nil, "/v1/runs")
end
"""


def create_body(text: str = "bench create", pad_to: int = 724) -> bytes:
    """A create body of about `pad_to` bytes: input, instructions and a context with 3 links. No `session_id`: the
    jobs of a row are independent (turns of one session would run one at a time, SPEC S4.3; the conversations row
    measures those)."""
    body: dict[str, object] = {
        "input": text,
        "instructions": "You review staging promotions. Summarise the risky changes in five bullet points.",
        "context": {"title": "Review staging promotion of payments-service 2026.12.1",
                    "url": "https://git.example.com/group/payments-service/-/merge_requests/1234",
                    "links": [{"text": text_, "url": url} for text_, url in LINKS]},
    }  # fmt: skip
    missing = pad_to - len(orjson.dumps(body))
    if missing > 0:
        body["input"] = f"{text} " + "x" * (missing - 1)
    return orjson.dumps(body)


@dataclass
class LoadResult:
    rate: float  #: requests per second
    p50_ms: float
    p99_ms: float
    requests: int
    failed: int  #: answers other than 2xx, and transport errors
    tool: str


def have_wrk() -> bool:
    return shutil.which("wrk") is not None


async def wrk_creates(url: str, concurrency: int, seconds: float, prefix: str, workdir: Path) -> LoadResult:
    script, body = workdir / "create.lua", workdir / "create-body.json"
    script.write_text(WRK_SCRIPT)
    body.write_bytes(create_body())
    threads = min(2, concurrency)
    argv = ["wrk", f"-t{threads}", f"-c{concurrency}", f"-d{max(1, round(seconds))}s", "--latency", "--timeout", "10s",
            "-s", str(script), url, "--", prefix, str(body)]  # fmt: skip
    pipe = asyncio.subprocess.PIPE
    process = await asyncio.create_subprocess_exec(*argv, stdout=pipe, stderr=pipe)
    out, err = await process.communicate()
    text = out.decode()
    if process.returncode != 0:
        raise RuntimeError(f"wrk failed: {err.decode().strip() or text}")
    return parse_wrk(text)


def parse_wrk(text: str) -> LoadResult:
    def latency(percent: str) -> float:
        found = re.search(rf"^\s*{percent}%\s+([\d.]+)(us|ms|s)\s*$", text, re.MULTILINE)
        if found is None:
            raise RuntimeError(f"wrk printed no {percent}% latency:\n{text}")
        return float(found.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[found.group(2)]

    rate = re.search(r"Requests/sec:\s+([\d.]+)", text)
    total = re.search(r"(\d+) requests in", text)
    non2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    if rate is None or total is None:
        raise RuntimeError(f"cannot read wrk's output:\n{text}")
    failed = int(non2xx.group(1)) if non2xx else 0
    failed += sum(int(group) for group in errors.groups()) if errors else 0
    return LoadResult(float(rate.group(1)), latency("50"), latency("99"), int(total.group(1)), failed, "wrk")


async def python_creates(url: str, concurrency: int, seconds: float, prefix: str) -> LoadResult:
    """The fallback load client: `concurrency` aiohttp workers posting for `seconds`, each with a fresh key."""
    body, counter, latencies, failed = create_body(), itertools.count(), [], 0
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        deadline = time.perf_counter() + seconds

        async def worker() -> None:
            nonlocal failed
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                key = {"Idempotency-Key": f"{prefix}-{next(counter)}"}
                try:
                    async with session.post(f"{url}/v1/runs", data=body, headers={**headers, **key}) as answer:
                        await answer.read()
                        failed += answer.status >= 300
                except aiohttp.ClientError:
                    failed += 1
                latencies.append((time.perf_counter() - started) * 1000)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return LoadResult(len(latencies) / elapsed, percentile(latencies, 50), percentile(latencies, 99), len(latencies),
                      failed, "aiohttp")  # fmt: skip


async def post_json(session: aiohttp.ClientSession, url: str, body: bytes, key: str | None = None) -> dict[str, object]:
    headers = {"Content-Type": "application/json", **({"Idempotency-Key": key} if key else {})}
    async with session.post(url, data=body, headers=headers) as answer:
        payload: dict[str, object] = await answer.json(content_type=None)
        if answer.status >= 300:
            raise RuntimeError(f"POST {url} answered {answer.status}: {payload}")
        return payload


async def gather_limited(limit: int, items: Sequence[T], call: Callable[[T], Awaitable[R]]) -> list[R]:
    """`call(item)` for every item, at most `limit` at once, results in order."""
    semaphore = asyncio.Semaphore(limit)

    async def one(item: T) -> R:
        async with semaphore:
            return await call(item)

    return list(await asyncio.gather(*(one(item) for item in items)))
