"""What counts as an answer (SPEC S10): a 502/503/504 without Hermes's envelope is no answer.

Hermes's envelope is `{"error": {"message", "type", "param", "code"}}` (shared/hermes-runs-api.md §1). Common
gateways in front of a dead backend answer 502/503/504 with a JSON object that is not that envelope: Kong
`{"message": "An invalid response was received from the upstream server"}`, AWS API Gateway
`{"message": "Internal server error"}` / `{"message": "Endpoint request timed out"}`, Envoy/Istio and nginx with a
JSON error page. Counting those as answers means a dead Hermes behind such a gateway is never lost, and a create
whose answer was lost there is not bound to its upstream."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from broker.hermes.client import AiohttpHermesClient, is_answer

GATEWAY_BODIES = [
    b'{"message":"An invalid response was received from the upstream server"}',  # Kong 502
    b'{"message": "Internal server error"}',  # AWS API Gateway 502
    b'{"message": "Endpoint request timed out"}',  # AWS API Gateway 504
    b'{"status": 503, "detail": "no healthy upstream"}',
]


@pytest.mark.parametrize("status", [502, 503, 504])
@pytest.mark.parametrize("body", GATEWAY_BODIES)
def test_a_gateways_json_error_is_no_answer_of_hermes(status: int, body: bytes) -> None:
    assert not is_answer(status, body)


def test_hermes_own_envelope_on_503_is_an_answer() -> None:
    draining = (
        b'{"error": {"message": "Gateway is draining", "type": "invalid_request_error", "code": "gateway_draining"}}'
    )
    assert is_answer(503, draining)


async def test_a_dead_hermes_behind_a_json_gateway_is_failing() -> None:
    # Given a gateway in front of a dead Hermes answering every call 502 with its own JSON body
    async def gateway(request: web.Request) -> web.Response:
        return web.json_response({"message": "An invalid response was received from the upstream server"}, status=502)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", gateway)
    server = TestServer(app)
    await server.start_server()
    client = AiohttpHermesClient(str(server.make_url("")), "k" * 20, 2_000)
    try:
        # When the broker polls a run and creates one there
        await client.get("run_1")
        created = await client.create(b'{"input": "x"}', idempotency_key="job-1")
        # Then its calls count as failures (the upstream's streak goes on: it can be found lost), and the create's
        # answer counts as lost (the job stays bound there: the gateway may have forwarded it)
        assert client.heard.failing
        assert getattr(created, "unanswered", False)
    finally:
        await client.aclose()
        await server.close()
