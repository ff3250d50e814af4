"""Callback fixtures: a real receiver (an aiohttp server on loopback recording every POST) and replicas that
call it back (its host allowed)."""

from __future__ import annotations

import base64
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

KEY = bytes(range(32))
SECRET = "whsec_" + base64.b64encode(KEY).decode()


@define
class Call:
    body: bytes
    status: int
    headers: dict[str, str]  #: the Standard Webhooks headers (`webhook-*`), lowercased
    verified: bool

    @property
    def payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = orjson.loads(self.body)
        return payload


@define
class Receiver:
    """Records every POST and answers the next of `answers` (200 once they run out); verifies each signature."""

    url: str = ""
    calls: list[Call] = field(factory=list)
    answers: list[int] = field(factory=list)
    verifier: Webhook = field(factory=lambda: Webhook(SECRET))

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {
            name.lower(): value for name, value in request.headers.items() if name.lower().startswith("webhook-")
        }
        try:
            self.verifier.verify(body, headers, json_parse=False)
            verified = True
        except WebhookVerificationError:
            verified = False
        status = self.answers.pop(0) if self.answers else 200
        self.calls.append(Call(body, status, headers, verified))
        return web.Response(status=status)

    def acknowledged(self) -> list[Call]:
        return [call for call in self.calls if 200 <= call.status < 300]


@pytest.fixture
async def receiver(aiohttp_server: Any) -> Receiver:
    recorder = Receiver()
    app = web.Application()
    app.router.add_post("/hook", recorder.handle)
    server: TestServer = await aiohttp_server(app, host="127.0.0.1")
    recorder.url = str(server.make_url("/hook"))
    return recorder


CallbackFactory = Callable[..., Awaitable[TestClient[Any, Any]]]


@pytest.fixture
def make_callback_replica(make_replica: ClientFactory) -> CallbackFactory:
    """A driving replica that signs callbacks with SECRET and allows the receiver's host (127.0.0.1)."""

    async def make(**overrides: Any) -> TestClient[Any, Any]:
        settings = {
            "callback_allowed_hosts": ("127.0.0.1",),
            "callback_signing_secrets": (KEY,),
            "board_timeout_ms": 2_000,
            **overrides,
        }
        return await make_replica(**settings)

    return make


async def until_calls(receiver: Receiver, count: int, *, timeout: float = 15.0) -> list[Call]:
    async def probe() -> list[Call] | None:
        return list(receiver.calls) if len(receiver.calls) >= count else None

    calls: list[Call] = await eventually(probe, timeout=timeout)
    return calls


async def callback_of(client: TestClient[Any, Any], job_id: str, status: str) -> dict[str, Any]:
    """The job object's `callback` once it shows `status`."""

    async def probe() -> dict[str, Any] | None:
        answer = await client.get(f"/v1/runs/{job_id}")
        callback: dict[str, Any] = (await answer.json())["callback"]
        return callback if callback["status"] == status else None

    found: dict[str, Any] = await eventually(probe)
    return found


def attempts(client: TestClient[Any, Any], outcome: str) -> float:
    """The replica's `callback_deliveries{outcome}` counter."""
    sample = client.app[metrics_key].registry.get_sample_value("hbr_callback_deliveries_total", {"outcome": outcome})
    return sample or 0.0
