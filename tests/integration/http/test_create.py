"""POST /v1/runs and GET /v1/runs/{id} over real HTTP and Redis (SPEC S3.1, S3.1.1, S3.2, S3.6)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.codec import decode, decode_view, encode_view
from broker.ids import fingerprint, is_job_id, job_id_for_key
from broker.store import keys
from broker.store.entries import Entries
from broker.store.jobs import JobStore
from projections.job import fold
from tests.conftest import BOTH_BACKENDS, free_port

pytestmark = BOTH_BACKENDS

JOB_FIELDS = {
    "object",
    "run_id",
    "status",
    "created_at",
    "updated_at",
    "session_id",
    "model",
    "last_event",
    "attempts",
    "hermes_run_id",
    "hold",
    "output",
    "usage",
    "error",
    "reporting",
    "scheduling",
    "upstream",  #: SPEC S10: null before an acceptance
    "owner",  #: SPEC S3.2: the replica driving the job, null while none does
}
CONTEXT = {
    "title": "Review staging promotion",
    "url": "https://git.example/mr/7",
    "links": [{"text": "Pipeline", "url": "http://ci.example/p/1"}],
}


async def _create(client: TestClient[Any, Any], body: Any, key: str | None = None, **headers: str) -> Any:
    if key is not None:
        headers["Idempotency-Key"] = key
    answer = await client.post("/v1/runs", json=body, headers=headers)
    assert answer.status == 202, await answer.text()
    document = await answer.json()
    assert answer.headers.get("Idempotency-Replayed") == ("true" if document["replayed"] else None)
    return document


async def _job_streams(redis: Redis) -> list[str]:
    return sorted([key async for key in redis.scan_iter(match=keys.EVENTS_MATCH)])


async def _until(probe: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await probe():
        assert time.monotonic() < deadline, "condition not reached before the deadline"
        await asyncio.sleep(0.02)


# -- the job object (S3.2) ------------------------------------------------------------------------


async def test_a_create_answers_a_queued_job_object(client: TestClient[Any, Any]) -> None:
    # Given nothing, when a minimal create arrives
    before = time.time()
    job = await _create(client, {"input": "hello"})
    # Then the answer is the S3.2 job object in status queued, not replayed
    assert set(job) == JOB_FIELDS | {"replayed"}
    assert is_job_id(job["run_id"])
    assert job["object"] == "hermes.run"
    assert (job["status"], job["last_event"], job["attempts"], job["replayed"]) == ("queued", "job.queued", 0, False)
    assert (job["hold"], job["output"], job["usage"], job["error"], job["hermes_run_id"]) == (None,) * 5
    assert job["upstream"] is None
    assert (job["session_id"], job["model"]) == (None, "hermes-agent")
    assert job["reporting"] == {"board": True, "post": True}
    assert job["scheduling"] == {"priority": 3, "fairness_key": "", "fairness_weight": 1.0, "multitask": "enqueue"}
    assert isinstance(job["created_at"], float) and isinstance(job["updated_at"], float)
    assert before - 1 <= job["created_at"] == job["updated_at"] <= time.time() + 1


async def test_a_full_create_keeps_session_model_context_and_reporting(client: TestClient[Any, Any]) -> None:
    body = {
        "input": [{"role": "user", "content": "review"}],
        "instructions": "be brief",
        "session_id": "s-1",
        "model": "gpt-x",
        "context": CONTEXT,
        "reporting": {"post": False},
        "unknown": {"ignored": True},
    }
    job = await _create(client, body, **{"X-Hermes-Session-Key": "sk-1"})
    assert (job["session_id"], job["model"], job["context"]) == ("s-1", "gpt-x", CONTEXT)
    assert job["reporting"] == {"board": True, "post": False}
    # And a poll answers the same object (without `replayed`)
    polled = await client.get(f"/v1/runs/{job['run_id']}")
    assert polled.status == 200
    assert await polled.json() == {k: v for k, v in job.items() if k != "replayed"}


async def test_context_is_absent_unless_supplied(client: TestClient[Any, Any]) -> None:
    job = await _create(client, {"input": "x"})
    assert "context" not in job
    minimal = await _create(client, {"input": "x", "context": {"title": "  T  "}})
    assert minimal["context"] == {"title": "  T  "}


async def test_the_stored_event_holds_only_the_execution_body(client: TestClient[Any, Any], redis: Redis) -> None:
    body = {"input": "x", "instructions": "i", "context": CONTEXT, "reporting": {"board": False}, "stream": True}
    job = await _create(client, body, **{"X-Hermes-Session-Key": "sk"})
    history = await JobStore(redis, retention_ms=60_000).read(job["run_id"])
    created = history[0][1]
    assert orjson.loads(created.body) == {"input": "x", "instructions": "i"}  # type: ignore[union-attr]
    assert created.session_key == "sk"  # type: ignore[union-attr]
    # kept there only: the view does not repeat it
    assert "body" not in orjson.loads((await redis.hgetall(keys.view(job["run_id"])))["state"])
    assert await JobStore(redis, retention_ms=60_000).execution_body(job["run_id"]) == created.body  # type: ignore[union-attr]


async def test_an_unknown_id_answers_404(client: TestClient[Any, Any]) -> None:
    answer = await client.get("/v1/runs/job_00000000000000000000000000000000")
    assert answer.status == 404
    assert (await answer.json())["error"]["code"] == "run_not_found"


# -- idempotency (S3.1.1) --------------------------------------------------------------------------


async def test_a_replay_answers_the_original_job(client: TestClient[Any, Any], redis: Redis) -> None:
    # Given a job created with a key
    first = await _create(client, {"input": "x", "instructions": "i", "context": CONTEXT}, "k-1")
    # When the same fingerprint comes again with other broker-only fields
    again = await _create(
        client,
        {"input": "x", "instructions": "i", "session_id": "other", "reporting": {"board": False}, "model": "m2"},
        "k-1",
    )
    # Then it is the original job, replayed, and nothing changed
    assert again["replayed"] is True
    assert {k: v for k, v in again.items() if k != "replayed"} == {k: v for k, v in first.items() if k != "replayed"}
    assert again["context"] == CONTEXT and again["session_id"] is None
    assert again["reporting"] == {"board": True, "post": True}
    assert len(await _job_streams(redis)) == 1
    assert await redis.xlen(keys.events(first["run_id"])) == 1


async def test_a_replay_answers_the_current_status(client: TestClient[Any, Any]) -> None:
    first = await _create(client, {"input": "x"}, "k-2")
    stopped = await client.post(f"/v1/runs/{first['run_id']}/stop")
    assert stopped.status == 200
    again = await _create(client, {"input": "x"}, "k-2")
    assert (again["replayed"], again["status"], again["run_id"]) == (True, "cancelled", first["run_id"])


@pytest.mark.parametrize(
    "changed",
    [{"input": "y"}, {"input": "x", "instructions": "j"}, {"input": [{"role": "user", "content": "x"}]}],
)
async def test_another_fingerprint_conflicts_and_stores_nothing(
    client: TestClient[Any, Any], redis: Redis, changed: dict[str, Any]
) -> None:
    first = await _create(client, {"input": "x"}, "k-3")
    before = await redis.dbsize()
    answer = await client.post("/v1/runs", json=changed, headers={"Idempotency-Key": "k-3"})
    assert answer.status == 409
    document = await answer.json()
    assert set(document["error"]) == {"message", "type", "param", "code"}
    assert document["error"]["code"] == "idempotency_key_conflict"
    assert await redis.dbsize() == before
    assert await redis.xlen(keys.events(first["run_id"])) == 1


async def test_creates_without_a_key_are_distinct_jobs(client: TestClient[Any, Any], redis: Redis) -> None:
    ids = {(await _create(client, {"input": "x"}))["run_id"] for _ in range(3)}
    assert len(ids) == 3
    assert len(await _job_streams(redis)) == 3


async def test_concurrent_creates_with_one_key_on_two_replicas_make_one_job(
    make_client: Callable[..., Awaitable[TestClient[Any, Any]]], redis: Redis
) -> None:
    # Given two replicas sharing one Redis
    replicas = [await make_client(), await make_client()]
    # When 20 creates with one key race through both
    answers = await asyncio.gather(
        *(_create(replicas[i % 2], {"input": "race", "context": {"title": f"t{i}"}}, "k-race") for i in range(20))
    )
    # Then exactly one job exists: one original answer and 19 replays of it
    assert len({answer["run_id"] for answer in answers}) == 1
    assert sorted(answer["replayed"] for answer in answers) == [False] + [True] * 19
    assert len({orjson.dumps(answer["context"]) for answer in answers}) == 1
    assert len(await _job_streams(redis)) == 1
    assert await redis.xlen(keys.events(answers[0]["run_id"])) == 1


# -- the stored view is a fold of the stream ---------------------------------------------------------


async def _assert_view_is_the_fold(redis: Redis, job_id: str) -> None:
    # One MULTI: a driver may append between two separate reads.
    async with redis.pipeline(transaction=True) as pipe:
        pipe.hgetall(keys.view(job_id))
        pipe.xrange(keys.events(job_id))
        stored, entries = await pipe.execute()
    history = await Entries(redis).events(job_id, entries, known=stored)  # packed ones too
    assert decode_view(stored["state"]) == fold(event for _, event in history)
    assert stored["last_id"] == history[-1][0]


async def test_the_stored_view_is_the_fold_of_the_stream(client: TestClient[Any, Any], redis: Redis) -> None:
    job = await _create(client, {"input": "x", "context": CONTEXT}, "k-view")
    await _assert_view_is_the_fold(redis, job["run_id"])
    assert (await client.post(f"/v1/runs/{job['run_id']}/stop")).status == 200
    assert await redis.xlen(keys.events(job["run_id"])) >= 2
    await _assert_view_is_the_fold(redis, job["run_id"])


async def test_the_view_a_driver_writes_is_the_fold_of_the_stream(
    make_client: Callable[..., Awaitable[TestClient[Any, Any]]], redis: Redis
) -> None:
    # Given a driving replica whose Hermes refuses connections (the job is held and retried)
    client = await make_client(drive=True, hermes_url=f"http://127.0.0.1:{free_port()}", runs_backoff_ms=20)
    job = await _create(client, {"input": "x"})

    async def held_twice() -> bool:
        return int(await redis.xlen(keys.events(job["run_id"]))) >= 3

    await _until(held_twice)
    polled = await (await client.get(f"/v1/runs/{job['run_id']}")).json()
    assert polled["status"] == "queued" and polled["hold"]["reason"] == "unavailable"
    await _assert_view_is_the_fold(redis, job["run_id"])


# -- retention (S3.6) --------------------------------------------------------------------------------


async def test_a_job_and_its_key_expire_after_retention(
    make_client: Callable[..., Awaitable[TestClient[Any, Any]]], redis: Redis
) -> None:
    # Given a replica with a short retention (long enough for a loaded CI machine to look) and a job with a key
    client = await make_client(runs_retention_ms=2_000)
    job = await _create(client, {"input": "x"}, "k-ret")
    assert await redis.pttl(keys.events(job["run_id"])) == -1  # a job that has not ended never expires
    # When it ends (a stop of a queued job cancels it at once)
    assert (await client.post(f"/v1/runs/{job['run_id']}/stop")).status == 200
    assert 0 < await redis.pttl(keys.events(job["run_id"])) <= 2_000

    # And the retention passes, then the job is gone
    async def gone() -> bool:
        return (await client.get(f"/v1/runs/{job['run_id']}")).status == 404

    await _until(gone)
    assert [key async for key in redis.scan_iter(match=keys.job_match(job["run_id"]))] == []
    # And the key is free again, even for another fingerprint
    again = await _create(client, {"input": "different"}, "k-ret")
    assert again["replayed"] is False
    assert again["status"] == "queued"


async def test_the_write_that_ends_a_job_starts_its_retention(client: TestClient[Any, Any], redis: Redis) -> None:
    # Given a queued job of an older store (a TTL renewed on every append)
    job = await _create(client, {"input": "x"})
    await redis.pexpire(keys.events(job["run_id"]), 50_000)
    await redis.pexpire(keys.view(job["run_id"]), 50_000)
    assert (await client.post(f"/v1/runs/{job['run_id']}/stop")).status == 200
    for key in (keys.events(job["run_id"]), keys.view(job["run_id"])):
        assert await redis.pttl(key) > 604_000_000


async def test_a_legacy_job_keeps_both_flags_and_a_replay_adds_no_context(
    client: TestClient[Any, Any], redis: Redis
) -> None:
    # Given a job stored by an older broker: no reporting flags, no context, in the event and the view
    job_id = job_id_for_key("k-legacy")
    legacy = {"type": "JobCreated", "job_id": job_id, "at_ms": 1_796_005_747_391, "body": '{"input":"x"}'}
    legacy["fingerprint"] = fingerprint("x", None)
    legacy["idempotency_key"] = "k-legacy"
    entry_id = await redis.xadd(keys.events(job_id), {keys.EVENT_FIELD: orjson.dumps(legacy)})
    view = orjson.loads(encode_view(fold([decode(orjson.dumps(legacy))])))  # type: ignore[arg-type]
    view.pop("reporting", None)  # left out already when at its default
    await redis.hset(keys.view(job_id), mapping={"state": orjson.dumps(view), "last_id": entry_id})
    # When it is polled, and replayed with context and reporting
    polled = await (await client.get(f"/v1/runs/{job_id}")).json()
    again = await _create(client, {"input": "x", "context": CONTEXT, "reporting": {"board": False}}, "k-legacy")
    # Then both flags are true and no context was added; its turns were never ordered (SPEC S4.3 came later)
    assert polled["reporting"] == again["reporting"] == {"board": True, "post": True}
    assert (
        polled["scheduling"]
        == again["scheduling"]
        == {"priority": 3, "fairness_key": "", "fairness_weight": 1.0, "multitask": "parallel"}
    )
    assert "context" not in polled and "context" not in again
    assert again["replayed"] is True
