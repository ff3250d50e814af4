"""Delivery under failures (SPEC S5.3, S5.6): retries with backoff, exhaustion, reconciliation, byte-for-byte replay."""

from __future__ import annotations

from redis.asyncio import Redis

from broker.ids import job_id_for_key
from broker.store import keys
from tests.conftest import BOTH_BACKENDS
from tests.integration.board.conftest import BoardFactory, Post, Receiver, deliveries, until_true
from tests.integration.driver.conftest import create, eventually, settled

pytestmark = BOTH_BACKENDS


async def test_a_receiver_failing_fewer_times_than_the_retries_still_gets_it(
    make_board_replica: BoardFactory, receiver: Receiver
) -> None:
    # Given a receiver that fails its next two POSTs, and three attempts per version
    receiver.fail_next = 2
    replica = await make_board_replica(board_retries=3)
    # When a job completes
    created = await create(replica, {"input": "hello"})
    reports = await receiver.until(created["run_id"], "done")
    # Then the first version went out on its third attempt, and nothing was exhausted. That version is the
    # creation's (running) unless the run ended before the sender took the key: the newer version is then
    # the key's pending delivery (S5: the latest version at least once), as seen on a loaded cluster.
    failed = [post for post in receiver.posts if post.status == 500]
    assert len(failed) == 2 and all(post.body == receiver.acknowledged(created["run_id"])[0].body for post in failed)
    assert reports[0]["state"] in ("running", "done") and reports[-1]["state"] == "done"
    assert deliveries(replica, "retried") == 2 and deliveries(replica, "exhausted") == 0


async def test_an_exhausted_version_waits_for_reconciliation(
    make_board_replica: BoardFactory, receiver: Receiver
) -> None:
    # Given a receiver that fails every POST, two attempts per version, reconciliation every 2 s
    receiver.failing = True
    replica = await make_board_replica(board_retries=2, board_reconcile_interval_ms=2_000)
    created = await create(replica, {"input": "hello"})
    job_id = created["run_id"]
    await settled(replica, job_id)

    def done_posts() -> list[Post]:
        return [post for post in receiver.posts if post.report["state"] == "done"]

    # When the terminal version exhausted its attempts
    await until_true(lambda: len(done_posts()) >= 2 and deliveries(replica, "exhausted") >= 1)
    assert not receiver.acknowledged(job_id)
    # and the receiver heals
    receiver.failing = False
    # Then reconciliation delivers the pending version: the latest one only, byte for byte
    reports = await receiver.until(job_id, "done")
    assert {post.body for post in receiver.acknowledged(job_id)} == {done_posts()[0].body}
    assert reports[-1]["state"] == "done"


async def test_a_replay_after_the_receiver_lost_its_history_is_byte_identical(
    make_board_replica: BoardFactory, receiver: Receiver
) -> None:
    # Given a completed job whose reports were acknowledged
    replica = await make_board_replica(board_reconcile_interval_ms=1_000)
    created = await create(replica, {"input": "hello tools:1", "session_id": "s-9", "context": {"title": "T"}})
    job_id = created["run_id"]
    await receiver.until(job_id, "done")
    original = receiver.acknowledged(job_id)[-1].body
    # When the receiver loses its history
    receiver.forget()
    # Then reconciliation replays the acknowledged latest version with the same bytes
    await receiver.until(job_id, "done")
    assert {post.body for post in receiver.acknowledged(job_id)} == {original}
    await until_true(lambda: deliveries(replica, "replayed") >= 1)


async def test_a_key_whose_lock_holder_died_goes_out_once_the_lock_expires(
    make_board_replica: BoardFactory, receiver: Receiver, redis: Redis
) -> None:
    # Given a key locked by a sender that died mid-delivery (its lock expires in 1.5 s)
    job_id = job_id_for_key("dead-holder")
    await redis.set(keys.board_lock(job_id), "dead-sender", px=1_500)
    replica = await make_board_replica()
    # When the job's versions are persisted meanwhile
    await create(replica, {"input": "hello"}, **{"Idempotency-Key": "dead-holder"})
    # Then the sender that found the key locked looks again after the lock expired and delivers the latest
    reports = await receiver.until(job_id, "done")
    assert reports[-1]["state"] == "done"
    # and gives the lock up (after the receiver's answer, so shortly after the receiver saw the report)

    async def unlocked() -> bool:
        return not await redis.exists(keys.board_lock(job_id))

    await eventually(unlocked, timeout=5)
