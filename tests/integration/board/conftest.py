"""Board fixtures: a real receiver (an aiohttp server recording every POST) and replicas that report to it."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from attrs import define, field
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from broker.http.appkeys import metrics_key
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import eventually, hermes_server, make_replica, sim

__all__ = ["hermes_server", "make_replica", "sim"]

#: Every key a report may have (SPEC S5); `sessionId`, `link` and `links` only when the job has them.
REPORT_KEYS = ("key", "platform", "sessionId", "state", "title", "link", "links", "error", "runId", "at",
               "sourceActivityAt", "reporting")  # fmt: skip
ALWAYS = {"key", "platform", "state", "title", "error", "runId", "at", "sourceActivityAt", "reporting"}


@define
class Post:
    body: bytes
    status: int
    content_type: str
    received_ms: int  #: receipt time (transport diagnostics only)
    webhook: dict[str, str] = field(factory=dict)  #: the Standard Webhooks headers (`webhook-*`) it carried
    verified: bool | None = None  #: what the receiver's verifier said (None: it has none)

    @property
    def report(self) -> dict[str, Any]:
        report: dict[str, Any] = orjson.loads(self.body)
        return report


@define
class Receiver:
    """Records every POST; answers 500 to the next `fail_next` ones, or to all while `failing`. With a
    `verifier` (the `standardwebhooks` package) it answers 401 to a POST whose signature fails, as a real one would."""

    url: str = ""
    posts: list[Post] = field(factory=list)
    fail_next: int = 0
    failing: bool = False
    jitter_s: float = 0.0  #: answer after a random pause up to this long (interleaves concurrent senders)
    verifier: Webhook | None = None
    #: acknowledged `at` went backwards for a key: (key, newest acknowledged at, at acknowledged after it)
    regressions: list[tuple[str, int, int]] = field(factory=list)
    _newest: dict[str, int] = field(factory=dict)

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self.jitter_s:
            await asyncio.sleep(random.uniform(0, self.jitter_s))
        webhook = {
            name.lower(): value for name, value in request.headers.items() if name.lower().startswith("webhook-")
        }
        verified = None if self.verifier is None else _verifies(self.verifier, body, webhook)
        status = 200
        if verified is False:
            status = 401
        elif self.failing or self.fail_next > 0:
            self.fail_next = max(0, self.fail_next - 1)
            status = 500
        self.posts.append(Post(body, status, request.content_type, time.time_ns() // 1_000_000, webhook, verified))
        if status == 200:
            report = orjson.loads(body)
            key, at = report["key"], report["at"]
            if at < self._newest.get(key, 0):
                self.regressions.append((key, self._newest[key], at))
            self._newest[key] = max(at, self._newest.get(key, 0))
        return web.Response(status=status)

    def acknowledged(self, job_id: str) -> list[Post]:
        return [post for post in self.posts if post.status == 200 and post.report["key"] == f"runs-{job_id}"]

    def reports(self, job_id: str) -> list[dict[str, Any]]:
        return [post.report for post in self.acknowledged(job_id)]

    def forget(self) -> None:
        """The receiver lost its history (a restart without storage)."""
        self.posts.clear()
        self._newest.clear()

    async def running_with_run(self, job_id: str) -> dict[str, Any]:
        """The first acknowledged report that names the Hermes run (the job was accepted)."""

        async def probe() -> dict[str, Any] | None:
            return next((report for report in self.reports(job_id) if report["runId"]), None)

        report: dict[str, Any] = await eventually(probe)
        return report

    async def until(self, job_id: str, state: str, *, timeout: float = 15.0) -> list[dict[str, Any]]:
        """The acknowledged reports of `job_id` once one in `state` arrived."""

        async def probe() -> list[dict[str, Any]] | None:
            reports = self.reports(job_id)
            return reports if any(report["state"] == state for report in reports) else None

        result: list[dict[str, Any]] = await eventually(probe, timeout=timeout)
        return result


def _verifies(verifier: Webhook, body: bytes, headers: dict[str, str]) -> bool:
    try:
        verifier.verify(body, headers, json_parse=False)
    except WebhookVerificationError:
        return False
    return True


@pytest.fixture
async def receiver(aiohttp_server: Any) -> Receiver:
    recorder = Receiver()
    app = web.Application()
    app.router.add_post("/board", recorder.handle)
    server: TestServer = await aiohttp_server(app)
    recorder.url = str(server.make_url("/board"))
    return recorder


BoardFactory = Callable[..., Awaitable[TestClient[Any, Any]]]


@pytest.fixture
def make_board_replica(receiver: Receiver, make_replica: ClientFactory) -> BoardFactory:
    """A driving replica with board reports to the receiver; reconciliation is hourly unless overridden."""

    async def make(**overrides: Any) -> TestClient[Any, Any]:
        settings = {"board_enabled": True, "board_url": receiver.url, "board_retries": 3, **overrides}
        return await make_replica(**settings)

    return make


async def until_true(check: Callable[[], object], *, timeout: float = 15.0) -> None:
    """Poll a synchronous check (receiver state, counters) until it holds."""

    async def probe() -> object:
        return check()

    await eventually(probe, timeout=timeout)


def deliveries(client: TestClient[Any, Any], outcome: str) -> float:
    """The replica's `board_deliveries{outcome}` counter."""
    value = client.app[metrics_key].registry.get_sample_value("hbr_board_deliveries_total", {"outcome": outcome})
    return value or 0.0
