"""Job callbacks (SPEC S5.8) against a real receiver: signed deliveries per terminal state and approval request,
at least once through failures with one `webhook-id`, 410 stopping a job's callbacks, the job object's state."""

from __future__ import annotations

from redis.asyncio import Redis

from broker.store import keys
from broker.store.callbacks import CallbackStore, Owed
from tests.conftest import BOTH_BACKENDS
from tests.integration.callbacks.conftest import (
    CallbackFactory,
    Receiver,
    attempts,
    callback_of,
    until_calls,
)
from tests.integration.driver.conftest import create, eventually, job, settled


@BOTH_BACKENDS  # the schedules' claims and the job write's callback keys on a Redis Cluster too
async def test_a_completed_job_calls_back_once_signed_with_the_job_object(
    make_callback_replica: CallbackFactory, receiver: Receiver
) -> None:
    # Given a replica signing callbacks, and a job created with one
    replica = await make_callback_replica()
    created = await create(replica, {"input": "hello", "callback": {"url": receiver.url}})
    job_id = created["run_id"]
    assert created["callback"] == {"url": receiver.url, "status": "pending", "attempts": 0, "last_error": None}
    # When it completes
    done = await settled(replica, job_id)
    [call] = await until_calls(receiver, 1)
    # Then the receiver got one POST, verified by the standardwebhooks package, naming the job's terminal state
    assert call.verified, call.headers
    assert call.headers["webhook-id"] == f"{job_id}:job.completed:1"
    payload = call.payload
    assert set(payload) == {"type", "created_at", "data"}
    assert payload["type"] == "job.completed"
    assert payload["created_at"] == round(done["updated_at"] * 1000)
    assert payload["data"]["run_id"] == job_id and payload["data"]["status"] == "completed"
    assert payload["data"]["output"] == done["output"]
    # and the job object shows it delivered, once
    callback = await callback_of(replica, job_id, "delivered")
    assert callback == {"url": receiver.url, "status": "delivered", "attempts": 1, "last_error": None}
    assert attempts(replica, "delivered") == 1
    # and so does the console's job page
    page = await (await replica.get(f"/console/jobs/{job_id}")).text()
    assert 'data-region="callback"' in page and '<td data-callback-field="status">delivered</td>' in page


async def test_a_failing_receiver_gets_the_same_delivery_again_until_it_acknowledges(
    make_callback_replica: CallbackFactory, receiver: Receiver
) -> None:
    # Given a receiver that fails its first POST (503), then recovers
    receiver.answers = [503]
    replica = await make_callback_replica()
    # When a job with a callback fails
    created = await create(replica, {"input": "hello fail", "callback": {"url": receiver.url}})
    job_id = created["run_id"]
    await settled(replica, job_id)
    first, retry = await until_calls(receiver, 2, timeout=20)
    # Then the retry is the same delivery: same webhook-id, same body, each signed for its own attempt
    assert (first.status, retry.status) == (503, 200)
    assert first.headers["webhook-id"] == retry.headers["webhook-id"] == f"{job_id}:job.failed:1"
    assert first.body == retry.body and first.verified and retry.verified
    assert retry.payload["type"] == "job.failed"
    # and the job object counts both attempts and keeps the error of the failed one
    callback = await callback_of(replica, job_id, "delivered")
    assert (callback["attempts"], callback["last_error"]) == (2, "HTTP 503")
    assert (attempts(replica, "retried"), attempts(replica, "delivered")) == (1, 1)


async def test_an_approval_request_and_the_end_are_two_deliveries_in_order(
    make_callback_replica: CallbackFactory, receiver: Receiver
) -> None:
    # Given a job with a callback whose run asks for an approval
    replica = await make_callback_replica()
    created = await create(replica, {"input": "please approval", "callback": {"url": receiver.url}})
    job_id = created["run_id"]
    # When the request is called back, approved, and the job completes
    [asked] = await until_calls(receiver, 1)
    assert asked.payload["type"] == "job.approval_requested"
    assert asked.payload["data"]["status"] == "waiting_for_approval"
    assert asked.headers["webhook-id"] == f"{job_id}:job.approval_requested:1"
    answer = await replica.post(f"/v1/runs/{job_id}/approval", json={"choice": "once"})
    assert answer.status == 200, await answer.text()
    await settled(replica, job_id)
    _, ended = await until_calls(receiver, 2)
    # Then the end is the second delivery, with an id of its own
    assert ended.payload["type"] == "job.completed" and ended.headers["webhook-id"] == f"{job_id}:job.completed:1"
    assert all(call.verified for call in receiver.calls)
    assert (await callback_of(replica, job_id, "delivered"))["attempts"] == 2


async def test_a_410_stops_the_jobs_callbacks(
    make_callback_replica: CallbackFactory, receiver: Receiver, redis: Redis
) -> None:
    # Given a receiver that answers 410 Gone to the approval request
    receiver.answers = [410]
    replica = await make_callback_replica()
    created = await create(replica, {"input": "please approval", "callback": {"url": receiver.url}})
    job_id = created["run_id"]
    await until_calls(receiver, 1)
    callback = await callback_of(replica, job_id, "gone")
    assert (callback["attempts"], callback["last_error"]) == (1, "HTTP 410")
    # When the job goes on to its end
    answer = await replica.post(f"/v1/runs/{job_id}/approval", json={"choice": "once"})
    assert answer.status == 200
    await settled(replica, job_id)
    # Then its end owes nothing: it is in no schedule, the receiver heard nothing more, the state stays gone
    assert await redis.zscore(keys.callbacks_due(keys.partition_of(job_id)), job_id) is None
    assert len(receiver.calls) == 1
    assert (await job(replica, job_id))["callback"]["status"] == "gone"
    assert attempts(replica, "gone") == 1


async def test_a_job_without_a_callback_has_none_and_no_callback_keys(
    make_callback_replica: CallbackFactory, receiver: Receiver, redis: Redis
) -> None:
    # Given a replica with callbacks, and a job created without one
    replica = await make_callback_replica()
    created = await create(replica, {"input": "please approval"})
    job_id = created["run_id"]
    # When it asks for an approval and completes
    await eventually(lambda: _status(replica, job_id, "waiting_for_approval"))
    await replica.post(f"/v1/runs/{job_id}/approval", json={"choice": "once"})
    done = await settled(replica, job_id)
    # Then its object has no callback, and nothing of callbacks was written for it
    assert "callback" not in created and "callback" not in done
    assert not await redis.exists(keys.callback(job_id))
    assert await redis.zcard(keys.callbacks_due(keys.partition_of(job_id))) == 0
    assert receiver.calls == []


async def _status(client: object, job_id: str, status: str) -> bool:
    return (await job(client, job_id))["status"] == status  # type: ignore[arg-type]


async def test_a_delivery_past_its_retry_window_is_given_up(
    make_callback_replica: CallbackFactory, receiver: Receiver, redis: Redis
) -> None:
    # Given a retry window shorter than the first retry, and a receiver that keeps failing
    receiver.answers = [500] * 10
    replica = await make_callback_replica(callback_retry_window_ms=1_000)
    created = await create(replica, {"input": "hello", "callback": {"url": receiver.url}})
    job_id = created["run_id"]
    # When its one attempt fails
    await until_calls(receiver, 1)
    # Then the delivery is given up: failed, off the schedule, counted
    callback = await callback_of(replica, job_id, "failed")
    assert (callback["attempts"], callback["last_error"]) == (1, "HTTP 500")
    assert await redis.zscore(keys.callbacks_due(keys.partition_of(job_id)), job_id) is None
    assert attempts(replica, "failed") == 1 and len(receiver.calls) == 1


async def test_a_late_give_up_from_another_sender_does_not_undo_a_delivery(
    make_callback_replica: CallbackFactory, receiver: Receiver, redis: Redis
) -> None:
    # Given a job whose delivery failed once and is due again
    receiver.answers = [503]
    replica = await make_callback_replica()
    created = await create(replica, {"input": "hello", "callback": {"url": receiver.url}})
    job_id = created["run_id"]
    await until_calls(receiver, 1)
    store = CallbackStore(redis)
    owed = await eventually(lambda: _failed_once(store, job_id))
    # When one sender's attempt is acknowledged, and another sender's attempt of the same delivery, made at the
    # same time (its claim had lapsed), comes back after it past the retry window
    await store.record(owed, "delivered", now_ms=owed.owed_since_ms + 1)
    await store.record(owed, "failed", error="HTTP 503", now_ms=owed.owed_since_ms + 2)
    # Then the delivery stays delivered: the receiver has it
    callback = (await job(replica, job_id))["callback"]
    assert callback["status"] == "delivered", callback


async def _failed_once(store: CallbackStore, job_id: str) -> Owed | None:
    owed = await store.first_owed(job_id)
    return owed if owed is not None and owed.failures == 1 else None


async def test_the_end_waits_behind_an_approval_request_in_retry(
    make_callback_replica: CallbackFactory, receiver: Receiver
) -> None:
    # Given a job whose approval request the receiver failed once (it is waiting for its retry)
    receiver.answers = [503]
    replica = await make_callback_replica()
    created = await create(replica, {"input": "please approval", "callback": {"url": receiver.url}})
    job_id = created["run_id"]
    await until_calls(receiver, 1)
    # When the job is approved and completes before that retry
    answer = await replica.post(f"/v1/runs/{job_id}/approval", json={"choice": "once"})
    assert answer.status == 200, await answer.text()
    await settled(replica, job_id)
    # Then the receiver gets the approval request again first, and only then the end
    calls = await until_calls(receiver, 3, timeout=20)
    seen = [(call.payload["type"], call.status) for call in calls]
    assert seen == [
        ("job.approval_requested", 503),
        ("job.approval_requested", 200),
        ("job.completed", 200),
    ]


async def test_a_replica_without_allowed_hosts_owes_the_callbacks_of_the_jobs_it_drives(
    make_callback_replica: CallbackFactory, receiver: Receiver
) -> None:
    # Given a job with a callback, asking for an approval, on a replica that allows the receiver's host
    first = await make_callback_replica()
    created = await create(first, {"input": "please approval", "callback": {"url": receiver.url}})
    job_id = created["run_id"]
    await until_calls(receiver, 1)
    await first.close()
    # When a replica without CALLBACK_ALLOWED_HOSTS (it delivers nothing) takes the job over and ends it
    bare = await make_callback_replica(callback_allowed_hosts=())
    answer = await bare.post(f"/v1/runs/{job_id}/approval", json={"choice": "once"})
    assert answer.status == 200, await answer.text()
    await settled(bare, job_id)
    assert (await job(bare, job_id))["callback"]["status"] == "pending"
    # Then the end was owed in its write: the next replica that delivers calls it back
    await make_callback_replica()
    _, ended = await until_calls(receiver, 2)
    assert ended.headers["webhook-id"] == f"{job_id}:job.completed:1" and ended.verified
    assert (await callback_of(bare, job_id, "delivered"))["attempts"] == 2
