from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient


async def test_create_then_poll(client: TestClient[Any, Any]) -> None:
    created = await client.post("/v1/runs", json={"input": "hello"})
    assert created.status == 202
    job = await created.json()
    polled = await client.get(f"/v1/runs/{job['run_id']}")
    assert polled.status == 200
    assert (await polled.json())["status"] == "queued"
