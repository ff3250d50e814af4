"""The rebuild's store (SPEC S7) against a real Redis: one consistent read, a replace guarded by the stream."""

from __future__ import annotations

import time

import orjson
import pytest
from redis.asyncio import Redis

from broker.board.projector import BoardSettings, board_write
from broker.codec import encode_board, encode_view
from broker.events import HoldReason, JobCreated, JobEvent, JobHeld, RunAccepted
from broker.rebuild import RebuildSettings, compare
from broker.store import keys
from broker.store.jobs import JobStore
from broker.store.rebuild import RebuildStore
from projections.job import JobView, fold
from tests.conftest import BOTH_BACKENDS

pytestmark = BOTH_BACKENDS

JOB = "job_22222222222222222222222222222222"
NOW = time.time_ns() // 1_000_000
BOARD = BoardSettings(platform="runs", ttl_ms=3_600_000, refresh_ms=60_000)
SETTINGS = RebuildSettings(board=BOARD, board_enabled=True)


@pytest.fixture
def jobs(redis: Redis) -> JobStore:
    return JobStore(redis, retention_ms=60_000)


@pytest.fixture
def store(redis: Redis) -> RebuildStore:
    return RebuildStore(redis)


def _events() -> list[JobEvent]:
    return [
        JobCreated(job_id=JOB, at_ms=NOW, body='{"input":"x"}', fingerprint="f" * 64),
        RunAccepted(job_id=JOB, at_ms=NOW + 5, attempt=1, hermes_run_id="run_1"),
    ]


def _view(events: list[JobEvent]) -> JobView:
    view = fold(events)
    assert view is not None
    return view


async def _job(jobs: JobStore) -> tuple[list[JobEvent], str]:
    """A job written as a board-enabled replica writes it: created, then accepted."""
    created, accepted = _events()
    assert isinstance(created, JobCreated)
    first = board_write(None, [created], BOARD, NOW)
    made = await jobs.create(created, _view([created]), first)
    second = board_write(first.state, [accepted], BOARD, NOW)
    [last] = await jobs.append(JOB, [accepted], _view(_events()), expected_last_id=made.snapshot.last_id, board=second)
    return _events(), last


def _held(n: int) -> JobHeld:
    return JobHeld(job_id=JOB, at_ms=NOW + 10 + n, reason=HoldReason.BUSY, retry_at_ms=NOW + 100)


async def test_an_intact_job_has_no_finding(jobs: JobStore, store: RebuildStore) -> None:
    await _job(jobs)
    assert compare(await store.read(JOB), SETTINGS, NOW) is None


async def test_a_replace_is_refused_when_an_event_was_appended_after_the_read(
    jobs: JobStore, store: RebuildStore, redis: Redis
) -> None:
    # Given a job whose stored view is garbage, read by the rebuild
    events, last = await _job(jobs)
    await redis.hset(keys.view(JOB), "state", "{garbage")  # type: ignore[misc]
    finding = compare(await store.read(JOB), SETTINGS, NOW)
    assert finding is not None and finding.replacement is not None
    # When a live replica appends before the rebuild writes
    held = [_held(1)]
    await jobs.append(JOB, held, _view([*events, *held]), expected_last_id=last)
    live = await redis.hgetall(keys.view(JOB))  # type: ignore[misc]
    # Then the replace is refused and the live write stands
    assert await store.replace(JOB, finding.replacement) is False
    assert await redis.hgetall(keys.view(JOB)) == live  # type: ignore[misc]
    # And a fresh read finds nothing to repair
    assert compare(await store.read(JOB), SETTINGS, NOW) is None


async def test_a_replace_of_a_missing_view_is_refused_when_the_stream_moved_on(
    jobs: JobStore, store: RebuildStore, redis: Redis
) -> None:
    # Given a job whose view is gone, read by the rebuild
    await _job(jobs)
    await redis.delete(keys.view(JOB))
    finding = compare(await store.read(JOB), SETTINGS, NOW)
    assert finding is not None and finding.replacement is not None
    assert finding.replacement.seen_view_last_id == ""
    # When an entry is added to its stream meanwhile
    await redis.xadd(keys.events(JOB), {keys.EVENT_FIELD: orjson.dumps({"type": "SomethingNewer"})})
    # Then nothing is written
    assert await store.replace(JOB, finding.replacement) is False
    assert await redis.exists(keys.view(JOB)) == 0


async def test_a_replace_is_refused_when_the_view_changed_after_the_read(
    jobs: JobStore, store: RebuildStore, redis: Redis
) -> None:
    # Given a read of a job whose view points nowhere
    await _job(jobs)
    await redis.hset(keys.view(JOB), "last_id", "1-1")  # type: ignore[misc]
    finding = compare(await store.read(JOB), SETTINGS, NOW)
    assert finding is not None and finding.replacement is not None and "last_id" in finding.differences
    # When someone else repairs the view first (another rebuild), the stream unchanged
    await redis.hset(keys.view(JOB), "last_id", "2-2")  # type: ignore[misc]
    # Then this replace does not overwrite it
    assert await store.replace(JOB, finding.replacement) is False
    assert await redis.hget(keys.view(JOB), "last_id") == "2-2"  # type: ignore[misc]


async def test_a_recreated_view_expires_with_its_stream(jobs: JobStore, store: RebuildStore, redis: Redis) -> None:
    events, last = await _job(jobs)
    await redis.delete(keys.view(JOB))
    await redis.pexpire(keys.events(JOB), 5_000)
    finding = compare(await store.read(JOB), SETTINGS, NOW)
    assert finding is not None and finding.replacement is not None
    assert await store.replace(JOB, finding.replacement) is True
    assert 0 < await redis.pttl(keys.view(JOB)) <= 5_000
    stored = await redis.hgetall(keys.view(JOB))  # type: ignore[misc]
    expected = board_write(None, events, BOARD, NOW).state
    assert stored == {
        "state": encode_view(_view(events)).decode(),
        "last_id": last,
        "board": encode_board(expected).decode(),
        keys.run_field(1): "run_1",  # each accepted attempt's run, as the job write keeps it
    }


async def test_an_acknowledged_version_is_repaired_without_a_new_delivery(
    jobs: JobStore, store: RebuildStore, redis: Redis
) -> None:
    # Given a job whose latest version was delivered and acknowledged, then garbled
    await _job(jobs)
    board = await redis.hgetall(keys.board(JOB))  # type: ignore[misc]
    await redis.hdel(keys.board(JOB), "pending_at", "pending_change")  # type: ignore[misc]
    await redis.hset(keys.board(JOB), mapping={"acked_at": board["latest_at"], "latest": "garbage"})  # type: ignore[misc]
    await redis.delete(keys.board_outbox(keys.partition_of(JOB)))
    # When the rebuild replaces it
    finding = compare(await store.read(JOB), SETTINGS, NOW)
    assert finding is not None and set(finding.differences) == {"board_report"}
    assert await store.replace(JOB, finding.replacement) is True  # type: ignore[arg-type]
    # Then the report is the rendered one again, still acknowledged, and nothing is queued
    repaired = await redis.hgetall(keys.board(JOB))  # type: ignore[misc]
    assert repaired["latest"] == board["latest"] and "pending_at" not in repaired
    assert await redis.exists(keys.board_outbox(keys.partition_of(JOB))) == 0


async def test_an_expired_board_version_is_not_recreated(jobs: JobStore, store: RebuildStore, redis: Redis) -> None:
    # Given a job whose board hash is gone, and whose version expired by now
    await _job(jobs)
    await redis.delete(keys.board(JOB))
    later = NOW + 5 + BOARD.ttl_ms  # the accept at NOW + 5 is the last activity
    # Then the missing board hash is no difference, and a replace leaves it gone
    assert compare(await store.read(JOB), SETTINGS, later) is None
    await redis.delete(keys.view(JOB))
    finding = compare(await store.read(JOB), SETTINGS, later)
    assert finding is not None and "board_report" not in finding.differences
    assert await store.replace(JOB, finding.replacement) is True  # type: ignore[arg-type]
    assert await redis.exists(keys.board(JOB)) == 0


async def test_a_stream_without_its_creation_is_reported_and_not_written(store: RebuildStore, redis: Redis) -> None:
    await redis.xadd(keys.events(JOB), {keys.EVENT_FIELD: orjson.dumps({"type": "RunAccepted"})})
    finding = compare(await store.read(JOB), SETTINGS, NOW)
    assert finding is not None and finding.replacement is None and "stream" in finding.differences
