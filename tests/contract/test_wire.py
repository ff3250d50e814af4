"""Contract: the raw wire format (bodies, headers, SSE framing) that the broker's proxy relays unchanged."""

from __future__ import annotations

import orjson

from broker.hermes import AiohttpHermesClient, Forwarded
from tests.contract.harness import Target
from tests.contract.helpers import body, settled, wait_for


async def test_create_answers_202_with_only_run_id_and_status(client: AiohttpHermesClient) -> None:
    answer = await client.forward("POST", "/v1/runs", body("hello"))
    assert isinstance(answer, Forwarded) and answer.status == 202
    assert answer.headers["Content-Type"].startswith("application/json")
    payload = orjson.loads(answer.body)
    assert set(payload) == {"run_id", "status"} and payload["status"] == "started"
    await wait_for(client, payload["run_id"], settled)


async def test_the_401_envelope_has_no_param(hermes: Target) -> None:
    client = AiohttpHermesClient(hermes.base_url, None, 10_000)
    try:
        answer = await client.forward("GET", "/v1/runs/run_x", None)
    finally:
        await client.aclose()
    assert isinstance(answer, Forwarded) and answer.status == 401
    assert orjson.loads(answer.body) == {
        "error": {"message": "Invalid API key", "type": "invalid_request_error", "code": "invalid_api_key"}
    }


async def test_the_event_stream_is_data_only_and_ends_with_stream_closed(client: AiohttpHermesClient) -> None:
    answer = await client.forward("POST", "/v1/runs", body("hello"))
    assert isinstance(answer, Forwarded)
    run_id = orjson.loads(answer.body)["run_id"]
    await wait_for(client, run_id, settled)
    async with client.forward_stream(f"/v1/runs/{run_id}/events") as upstream:
        assert upstream.status == 200
        assert upstream.headers["Content-Type"] == "text/event-stream"
        assert upstream.headers["Cache-Control"] == "no-cache"
        assert upstream.headers["X-Accel-Buffering"] == "no"
        raw = (await upstream.read()).decode()
    frames = raw.split("\n\n")
    assert frames[-2:] == [": stream closed", ""]
    assert all(frame.startswith("data: {") and "\n" not in frame for frame in frames[:-2])
    assert orjson.loads(frames[-3][len("data: ") :])["event"] == "run.completed"
