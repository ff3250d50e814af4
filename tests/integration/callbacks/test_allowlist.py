"""The create's `callback` (SPEC S5.8): only a URL whose host is in CALLBACK_ALLOWED_HOSTS is taken; anything else
answers 400 `invalid_callback` naming the field, and nothing is stored."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from tests.integration.callbacks.conftest import CallbackFactory, Receiver, callback_of, until_calls
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled

ALLOWED = ("hooks.example.com", "*.example.org")

REFUSED = [
    ({"url": "https://internal.local/hook"}, "callback.url", "not in CALLBACK_ALLOWED_HOSTS"),
    ({"url": "https://example.org/hook"}, "callback.url", "not in CALLBACK_ALLOWED_HOSTS"),  # *.suffix: under it
    ({"url": "https://hooks.example.com.evil.net/"}, "callback.url", "not in CALLBACK_ALLOWED_HOSTS"),
    ({"url": "https://user:pw@hooks.example.com/"}, "callback.url", "username or password"),
    ({"url": "ftp://hooks.example.com/"}, "callback.url", "http or https URL"),
    ({"url": "https://hooks.example.com/" + "a" * 2048}, "callback.url", "at most 2048"),
    # hosts that match the allowlist as text, but that the HTTP client cannot send to (empty labels, a backslash,
    # bytes no host name has): refused here, not left to fail every delivery attempt for days
    ({"url": "https://.example.org/hook"}, "callback.url", "host name"),
    ({"url": "https://a..example.org/hook"}, "callback.url", "host name"),
    ({"url": "https://hooks.example.com../hook"}, "callback.url", "host name"),
    ({"url": "https://evil.net\\.example.org/hook"}, "callback.url", "http or https URL"),
    ({"url": "https://evil.net%2f.example.org/hook"}, "callback.url", "host name"),
    ({"url": "https://127.0.0.1\u0000.example.org/hook"}, "callback.url", "http or https URL"),
    ({"url": "https://evil.net .example.org/hook"}, "callback.url", "http or https URL"),
    ({"url": "https://hooks.example.com/\r\nX-Injected: 1"}, "callback.url", "http or https URL"),
    ({"url": "https://-a.example.org/hook"}, "callback.url", "host name"),
    ({"url": "https://[::1]/hook"}, "callback.url", "host name"),  # an IPv6 literal: the allowlist names none
    ({"url": "https://hooks.example.com.evil.net./"}, "callback.url", "not in CALLBACK_ALLOWED_HOSTS"),
    ({"url": "https://evil-example.org/"}, "callback.url", "not in CALLBACK_ALLOWED_HOSTS"),
    ({"url": 5}, "callback.url", "http or https URL"),
    ({}, "callback.url", "http or https URL"),
    (["https://hooks.example.com/"], "callback", "must be an object"),
    ("https://hooks.example.com/", "callback", "must be an object"),
]


async def _keys(redis: Redis) -> set[str]:
    return {key async for key in redis.scan_iter(count=1_000)}


@pytest.mark.parametrize(("callback", "param", "says"), REFUSED)
async def test_a_callback_the_allowlist_refuses_answers_400_and_stores_nothing(
    make_client: ClientFactory, redis: Redis, callback: Any, param: str, says: str
) -> None:
    # Given a broker allowing two hosts
    client = await make_client(callback_allowed_hosts=ALLOWED)
    before = await _keys(redis)
    # When a create names another host (or a URL that breaks a rule)
    answer = await client.post("/v1/runs", json={"input": "hi", "callback": callback}, headers={"Idempotency-Key": "k"})
    # Then it is refused, naming the field, and nothing was stored (the key is still free)
    assert answer.status == 400
    error = (await answer.json())["error"]
    assert (error["code"], error["param"], error["type"]) == ("invalid_callback", param, "invalid_request_error")
    assert says in error["message"]
    assert await _keys(redis) == before


async def test_without_allowed_hosts_every_callback_is_refused(make_client: ClientFactory) -> None:
    client = await make_client()
    answer = await client.post("/v1/runs", json={"input": "hi", "callback": {"url": "https://hooks.example.com/"}})
    assert answer.status == 400 and (await answer.json())["error"]["code"] == "invalid_callback"


@pytest.mark.parametrize(
    "url",
    [
        "https://hooks.example.com/h",
        "http://HOOKS.example.com:8443/h",
        "https://a.b.example.org/",
        "https://hooks.example.com./h",  # the same host, written as an absolute name
        "https://b\u00fccher.example.org/",  # an IDN label under an allowed suffix (sent as xn--bcher-kva)
    ],
)
async def test_an_allowed_host_is_taken_and_shown_pending(make_client: ClientFactory, url: str) -> None:
    client = await make_client(callback_allowed_hosts=ALLOWED)
    answer = await client.post("/v1/runs", json={"input": "hi", "callback": {"url": url}})
    assert answer.status == 202
    created = await answer.json()
    assert created["callback"] == {"url": url, "status": "pending", "attempts": 0, "last_error": None}
    shown = await (await client.get(f"/v1/runs/{created['run_id']}")).json()
    assert shown["callback"] == created["callback"]
    listed = await (await client.get("/v1/runs")).json()
    assert listed["data"][0]["callback"] == created["callback"]


async def test_a_replay_never_changes_a_jobs_callback(make_client: ClientFactory) -> None:
    # Given a job created with a callback under an Idempotency-Key
    client = await make_client(callback_allowed_hosts=ALLOWED)
    first = {"input": "hi", "callback": {"url": "https://hooks.example.com/one"}}
    created = await (await client.post("/v1/runs", json=first, headers={"Idempotency-Key": "same"})).json()
    # When the create is replayed with another callback, or none
    for body in ({"input": "hi", "callback": {"url": "https://hooks.example.com/two"}}, {"input": "hi"}):
        again = await client.post("/v1/runs", json=body, headers={"Idempotency-Key": "same"})
        replayed = await again.json()
        # Then the job keeps its first callback
        assert replayed["replayed"] is True and replayed["callback"] == created["callback"]


async def test_a_host_taken_off_the_allowlist_is_never_called_again(
    make_callback_replica: CallbackFactory, receiver: Receiver
) -> None:
    # Given a job whose callback host was allowed when it was created, and that was called back once
    first = await make_callback_replica()
    created = await create(first, {"input": "please approval", "callback": {"url": receiver.url}})
    job_id = created["run_id"]
    await until_calls(receiver, 1)
    await callback_of(first, job_id, "delivered")
    # When the operator takes that host off CALLBACK_ALLOWED_HOSTS (the replica is replaced by one without it)
    await first.close()
    second = await make_callback_replica(callback_allowed_hosts=("hooks.example.com",))
    answer = await second.post(f"/v1/runs/{job_id}/approval", json={"choice": "once"})
    assert answer.status == 200, await answer.text()
    await settled(second, job_id)
    # Then the job's end is not POSTed there: the attempt fails naming the allowlist, and the receiver heard nothing
    callback = await eventually(lambda: _failed_on_allowlist(second, job_id))
    assert callback["status"] == "pending" and len(receiver.calls) == 1


async def _failed_on_allowlist(client: TestClient[Any, Any], job_id: str) -> dict[str, Any] | None:
    callback: dict[str, Any] = (await job(client, job_id))["callback"]
    return callback if "CALLBACK_ALLOWED_HOSTS" in (callback["last_error"] or "") else None
