"""Cross-site requests change nothing (SPEC S8): a create, stop or approval a browser marks as cross-site
answers 403 `cross_site_request` and stores nothing; same-origin browsers and header-less clients pass."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.http.crosssite import same_origin_host

JSON = {"Content-Type": "application/json"}
CROSS_SITE = [
    {"Sec-Fetch-Site": "cross-site"},
    {"Sec-Fetch-Site": "Cross-Site", "Origin": "{self}"},  # the fetch metadata wins over a matching Origin
    {"Origin": "https://evil.example"},
    {"Origin": "{scheme}://127.0.0.1:1"},  # same host, another port
    {"Origin": "null"},
    {"Origin": "{self}.evil.example"},
]
ALLOWED = [
    {},
    {"Sec-Fetch-Site": "same-origin", "Origin": "{self}"},
    {"Sec-Fetch-Site": "same-site"},
    {"Sec-Fetch-Site": "none"},
    {"Origin": "{self}"},
]


def _headers(client: TestClient[Any, Any], template: dict[str, str]) -> dict[str, str]:
    own = f"http://{client.host}:{client.port}"
    return {name: value.format(self=own, scheme="http") for name, value in template.items()}


async def _create(client: TestClient[Any, Any], **headers: str) -> Any:
    return await client.post("/v1/runs", data=orjson.dumps({"input": "hi"}), headers={**JSON, **headers})


def _assert_refused(status: int, body: dict[str, Any]) -> None:
    assert status == 403
    assert body["error"]["code"] == "cross_site_request"
    assert body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("template", CROSS_SITE)
async def test_a_cross_site_create_stores_nothing(
    client: TestClient[Any, Any], redis: Redis, template: dict[str, str]
) -> None:
    answer = await _create(client, **_headers(client, template))
    _assert_refused(answer.status, await answer.json())
    assert await redis.keys("hbr:{p*") == []
    assert (await (await client.get("/v1/runs")).json())["data"] == []


@pytest.mark.parametrize("template", CROSS_SITE)
async def test_a_cross_site_stop_or_approval_changes_nothing(
    client: TestClient[Any, Any], template: dict[str, str]
) -> None:
    job = await (await _create(client)).json()
    for route, body in (("stop", b""), ("approval", b'{"choice": "deny"}')):
        answer = await client.post(f"/v1/runs/{job['run_id']}/{route}", data=body, headers=_headers(client, template))
        _assert_refused(answer.status, await answer.json())
    after = await (await client.get(f"/v1/runs/{job['run_id']}")).json()
    assert after["status"] == "queued" and after["updated_at"] == job["updated_at"]
    assert after["last_event"] == "job.queued"


@pytest.mark.parametrize("template", ALLOWED)
async def test_same_origin_browsers_and_plain_clients_pass(
    client: TestClient[Any, Any], template: dict[str, str]
) -> None:
    answer = await _create(client, **_headers(client, template))
    assert answer.status == 202
    job = await answer.json()
    stop = await client.post(f"/v1/runs/{job['run_id']}/stop", headers=_headers(client, template))
    assert stop.status == 200 and (await stop.json())["status"] == "cancelled"


async def test_reads_are_never_refused(client: TestClient[Any, Any]) -> None:
    job = await (await _create(client)).json()
    for path in (f"/v1/runs/{job['run_id']}", "/v1/runs"):
        answer = await client.get(path, headers={"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"})
        assert answer.status == 200


@pytest.mark.parametrize(
    ("origin", "host", "same"),
    [
        ("http://a.example", "a.example", True),
        ("http://a.example", "a.example:80", True),
        ("https://a.example", "a.example:443", True),
        ("http://A.Example:8080", "a.example:8080", True),
        ("http://[::1]:8080", "[::1]:8080", True),
        ("https://a.example", "a.example:80", False),
        ("http://a.example:8080", "a.example", False),
        ("http://b.example", "a.example", False),
        ("http://a.example/path", "a.example", False),
        ("ftp://a.example", "a.example", False),
        ("null", "a.example", False),
        ("http://a.example", "", False),
        ("http://a.example:99999", "a.example", False),
        ("http://[::1", "[::1]", False),
    ],
)
def test_origin_against_host(origin: str, host: str, same: bool) -> None:
    assert same_origin_host(origin, host) is same
