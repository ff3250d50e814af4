"""The checks' HTTP side, stdlib only: wait for a route to answer 200, create a job, poll it to a status."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any

from imagelib.common import CheckFailed
from imagelib.launch import Proc

POLL_S = 0.2


def request(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """(status, decoded JSON or text); raises OSError when nothing answers."""
    data = json.dumps(body).encode() if body is not None else None
    outgoing = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(outgoing, timeout=10) as answer:
            status, raw = answer.status, answer.read()
    except urllib.error.HTTPError as error:
        status, raw = error.code, error.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def wait_ok(url: str, check: str, proc: Proc, timeout: float) -> float:
    """Polls `url` until it answers 200; fails `check` when `proc` exits first or at the deadline."""
    started = time.monotonic()
    last = "nothing yet"
    while time.monotonic() - started < timeout:
        try:
            status, body = request("GET", url)
        except OSError as error:
            last = f"{type(error).__name__}: {error}"
        else:
            if status == 200:
                return time.monotonic() - started
            last = f"{status} {str(body)[:200]}"
        code = proc.exit_code()
        if code is not None:
            raise CheckFailed(check, f"{proc.name} exited {code} before {url} answered 200 (last: {last})")
        time.sleep(POLL_S)
    raise CheckFailed(check, f"no 200 from {url} within {timeout:.0f} s (last: {last})")


def create_job(base_url: str, body: dict[str, Any], check: str) -> str:
    try:
        status, answer = request("POST", f"{base_url}/v1/runs", body)
    except OSError as error:
        raise CheckFailed(check, f"POST /v1/runs: {error}") from None
    if status != 202 or not isinstance(answer, dict) or "run_id" not in answer:
        raise CheckFailed(check, f"POST /v1/runs answered {status} {str(answer)[:200]}, not 202 with a run_id")
    return str(answer["run_id"])


def get_job(base_url: str, job: str, check: str) -> dict[str, Any]:
    try:
        status, answer = request("GET", f"{base_url}/v1/runs/{job}")
    except OSError as error:
        raise CheckFailed(check, f"GET /v1/runs/{job}: {error}") from None
    if status != 200 or not isinstance(answer, dict):
        raise CheckFailed(check, f"GET /v1/runs/{job} answered {status} {str(answer)[:200]}")
    return answer


def wait_status(base_url: str, job: str, wanted: str, check: str, timeout: float) -> dict[str, Any]:
    """Polls the job until its status is `wanted`; an other end (failed, stopped) or the deadline fails `check`."""
    deadline = time.monotonic() + timeout
    while True:
        answer = get_job(base_url, job, check)
        if answer.get("status") == wanted:
            return answer
        if answer.get("status") in {"completed", "failed", "stopped"} - {wanted}:
            raise CheckFailed(check, f"{job} ended {answer.get('status')} (error {answer.get('error')}), not {wanted}")
        if time.monotonic() > deadline:
            raise CheckFailed(check, f"{job} is still {answer.get('status')} after {timeout:.0f} s, not {wanted}")
        time.sleep(POLL_S)
