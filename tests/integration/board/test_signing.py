"""Signed deliveries (SPEC S5.7): a receiver verifying with the `standardwebhooks` package accepts every delivery
of the board sender (first, retry after a 500, reconciliation replay); `webhook-id` is the version's `<key>:<at>`."""

from __future__ import annotations

import base64

from standardwebhooks.webhooks import Webhook

from broker.config import Config
from tests.integration.board.conftest import BoardFactory, Post, Receiver, deliveries, until_true
from tests.integration.driver.conftest import create

OLD_KEY, NEW_KEY = bytes(range(24)), bytes(range(100, 132))


def whsec(key: bytes) -> str:
    return "whsec_" + base64.b64encode(key).decode()


def signing(secret: str) -> dict[str, tuple[bytes, ...]]:
    """The config override an operator's BOARD_SIGNING_SECRET gives (parsed as at startup)."""
    return {"board_signing_secrets": Config.from_env({"BOARD_SIGNING_SECRET": secret}).board_signing_secrets}


def message_id(post: Post) -> str:
    return f"{post.report['key']}:{post.report['at']}"


async def test_every_delivery_retry_and_replay_verifies_under_either_key_of_a_rotation(
    make_board_replica: BoardFactory, receiver: Receiver
) -> None:
    # Given a broker signing with two keys (a rotation), a receiver that already verifies with the new one and
    # fails its first POST, and reconciliation every second
    receiver.verifier = Webhook(whsec(NEW_KEY))
    receiver.fail_next = 1
    rotation = signing(f"{whsec(OLD_KEY)} {whsec(NEW_KEY)}")
    replica = await make_board_replica(**rotation, board_reconcile_interval_ms=1_000)
    # When a job runs to the end
    created = await create(replica, {"input": "hello tools:1", "session_id": "s-1", "context": {"title": "T"}})
    job_id = created["run_id"]
    await receiver.until(job_id, "done")
    original, first_round = receiver.acknowledged(job_id)[-1], list(receiver.posts)
    # and the receiver loses its history, so that reconciliation's replay is what it gets next
    receiver.forget()
    await receiver.until(job_id, "done")
    await until_true(lambda: deliveries(replica, "replayed") >= 1)
    posts = first_round + receiver.posts
    # Then every delivery was verified (none answered 401), the retry after the 500 included
    assert posts and all(post.verified for post in posts), [(post.status, post.webhook) for post in posts]
    retried = next(post for post in posts if post.status == 500)
    retry = next(post for post in posts if post.status == 200 and post.body == retried.body)
    assert retry.webhook["webhook-id"] == retried.webhook["webhook-id"] == message_id(retried)
    # and a receiver still holding the old key verifies the same deliveries (sent ones, unchanged)
    old = Webhook(whsec(OLD_KEY))
    for post in [retried, retry, original, *posts]:
        assert old.verify(post.body, post.webhook) == post.report
    # and `webhook-id` is `<key>:<at>` of the body, the same for the replay as for the original delivery
    assert all(post.webhook["webhook-id"] == message_id(post) for post in posts)
    replay = receiver.acknowledged(job_id)[0]
    assert (replay.body, replay.webhook["webhook-id"]) == (original.body, original.webhook["webhook-id"])
    # with the timestamp of its own attempt
    assert int(replay.webhook["webhook-timestamp"]) >= int(original.webhook["webhook-timestamp"])


async def test_a_receiver_with_a_wrong_key_refuses_every_delivery(
    make_board_replica: BoardFactory, receiver: Receiver
) -> None:
    # Given a receiver that verifies with a key the broker does not hold
    receiver.verifier = Webhook(whsec(NEW_KEY))
    replica = await make_board_replica(**signing(whsec(OLD_KEY)), board_retries=1)
    # When a job runs
    created = await create(replica, {"input": "hello"})
    # Then the receiver refuses what arrives, and nothing is acknowledged
    await until_true(lambda: len(receiver.posts) >= 1)
    assert all(post.verified is False and post.status == 401 for post in receiver.posts)
    assert not receiver.acknowledged(created["run_id"])


async def test_without_a_secret_deliveries_carry_no_webhook_headers(
    make_board_replica: BoardFactory, receiver: Receiver
) -> None:
    replica = await make_board_replica()
    created = await create(replica, {"input": "hello"})
    await receiver.until(created["run_id"], "done")
    assert receiver.posts and all(post.webhook == {} for post in receiver.posts)
