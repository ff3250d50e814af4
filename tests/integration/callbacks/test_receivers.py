"""Job callbacks (SPEC S5.8) against receivers that misbehave: the sender judges a delivery by the answer's status
and never waits on, or keeps, what the receiver sends after it."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio import Redis

from broker.callbacks.sender import MAX_DELIVERIES, MAX_PER_RECEIVER, CallbackDelivery, CallbackSender
from broker.clock import SystemClock
from broker.metrics import Metrics
from broker.store.callbacks import CallbackStore, Owed
from tests.integration.callbacks.conftest import CallbackFactory, Receiver, attempts, callback_of, until_calls
from tests.integration.driver.conftest import create, eventually, job


async def test_a_2xx_whose_body_never_ends_is_delivered_at_the_status(
    make_callback_replica: CallbackFactory, aiohttp_server: Any
) -> None:
    # Given a receiver that answers 200 at once, then trickles a body it never finishes
    posts: list[str] = []

    async def trickle(request: web.Request) -> web.StreamResponse:
        posts.append(request.headers["webhook-id"])
        await request.read()
        answer = web.StreamResponse(status=200)
        await answer.prepare(request)
        while True:
            await answer.write(b" ")
            await asyncio.sleep(0.1)

    app = web.Application()
    app.router.add_post("/hook", trickle)
    server: TestServer = await aiohttp_server(app, host="127.0.0.1")
    replica = await make_callback_replica(board_timeout_ms=1_000)
    # When a job with a callback there completes
    created = await create(replica, {"input": "hello", "callback": {"url": str(server.make_url("/hook"))}})
    job_id = created["run_id"]
    # Then its delivery is acknowledged by the status, on the first attempt: not a timeout, not a retry
    callback = await callback_of(replica, job_id, "delivered")
    assert (callback["attempts"], callback["last_error"]) == (1, None)
    assert posts == [f"{job_id}:job.completed:1"]
    assert attempts(replica, "retried") == 0


async def test_a_url_the_client_cannot_send_to_is_a_failed_attempt_not_a_crash(redis: Redis) -> None:
    # Given a delivery owed to a URL an earlier broker took (an empty label: the client cannot encode the host)
    owed = Owed(
        job_id="job_" + "d" * 32,
        url="http://a..example.org/hook",
        webhook_id="w",
        body=b"{}",
        owed_since_ms=0,
        failures=0,
    )
    async with aiohttp.ClientSession() as session:
        sender = CallbackSender(CallbackStore(redis), session, CallbackDelivery(), SystemClock(), Metrics())
        # When the sender tries it
        status, error, retry_after = await sender._post(owed)
    # Then the attempt failed like an unreachable receiver (recorded, retried with backoff, given up in time),
    # instead of raising past the record and coming back every claim for as long as the job's hash lives
    assert status is None and retry_after is None and error


async def test_a_receiver_that_never_answers_does_not_hold_back_other_receivers(
    make_callback_replica: CallbackFactory, receiver: Receiver, aiohttp_server: Any
) -> None:
    # Given a receiver that takes every POST and never answers, owed more deliveries than a replica makes at once
    held: list[str] = []
    never = asyncio.Event()

    async def hang(request: web.Request) -> web.Response:
        held.append(request.headers["webhook-id"])
        await never.wait()
        return web.Response()

    app = web.Application()
    app.router.add_post("/hook", hang)
    frozen: TestServer = await aiohttp_server(app, host="127.0.0.1")
    replica = await make_callback_replica(board_timeout_ms=30_000)
    frozen_jobs = []
    for n in range(MAX_DELIVERIES + 8):
        body = {"input": f"hello {n}", "callback": {"url": str(frozen.make_url("/hook"))}}
        frozen_jobs.append((await create(replica, body))["run_id"])
    await eventually(lambda: _at_least(held, 4))
    # When a job calls back another, healthy receiver
    created = await create(replica, {"input": "hello", "callback": {"url": receiver.url}})
    # Then that delivery goes out at once, not after the frozen receiver's attempts time out
    [call] = await until_calls(receiver, 1, timeout=5)
    assert call.headers["webhook-id"] == f"{created['run_id']}:job.completed:1"
    # and the frozen receiver holds no more of them than one receiver may
    assert len(held) <= MAX_PER_RECEIVER
    # and once it answers, every delivery it was owed reaches it: the ones that waited were deferred, not lost
    never.set()
    await eventually(lambda: _all_delivered(replica, frozen_jobs), timeout=60)


async def _at_least(items: list[str], count: int) -> bool:
    return len(items) >= count


async def _all_delivered(client: TestClient[Any, Any], job_ids: list[str]) -> bool:
    for job_id in job_ids:
        if (await job(client, job_id))["callback"]["status"] != "delivered":
            return False
    return True


async def test_an_unreadable_retry_after_neither_undoes_a_2xx_nor_stops_the_retries(
    make_callback_replica: CallbackFactory, aiohttp_server: Any
) -> None:
    # Given a receiver that answers with a Retry-After of more digits than an integer is read from: 503, then 200
    answers = [503, 200]
    posts: list[int] = []

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        posts.append(answers.pop(0) if answers else 200)
        return web.Response(status=posts[-1], headers={"Retry-After": "9" * 5_000})

    app = web.Application()
    app.router.add_post("/hook", answer)
    server: TestServer = await aiohttp_server(app, host="127.0.0.1")
    replica = await make_callback_replica(callback_retry_window_ms=86_400_000)
    # When a job calls it back
    created = await create(replica, {"input": "hello", "callback": {"url": str(server.make_url("/hook"))}})
    # Then the 503 is a failed attempt whose Retry-After is past the retry window (given up, as for any such
    # answer), not an error outside the attempt's record
    callback = await callback_of(replica, created["run_id"], "failed")
    assert (callback["attempts"], callback["last_error"]) == (1, "HTTP 503")
    # and a 2xx with such a header is delivered
    second = await create(replica, {"input": "hello", "callback": {"url": str(server.make_url("/hook"))}})
    callback = await callback_of(replica, second["run_id"], "delivered")
    assert (callback["attempts"], callback["last_error"]) == (1, None)
