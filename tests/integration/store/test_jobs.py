"""JobStore against a real Redis: create claims once, appends are atomic, checked and fenced."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from broker.codec import decode_view
from broker.errors import JobNotFound, LeaseLost, StreamConflict
from broker.events import (
    HermesEventRecorded,
    HoldReason,
    JobCreated,
    JobEvent,
    JobFinished,
    JobHeld,
    JobStatus,
    RunAccepted,
    StopRequested,
)
from broker.store import keys, signals
from broker.store.jobs import JobStore
from projections.job import JobView, fold
from tests.conftest import BOTH_BACKENDS, free_port

pytestmark = BOTH_BACKENDS

JOB = "job_11111111111111111111111111111111"
T0 = 1_796_005_747_391


@pytest.fixture
def store(redis: Redis) -> JobStore:
    return JobStore(redis, retention_ms=60_000)


def _created(job_id: str = JOB, body: str = '{"input":"x"}') -> JobCreated:
    return JobCreated(job_id=job_id, at_ms=T0, body=body, fingerprint="f" * 64, idempotency_key="k")


def _view(*events: JobEvent) -> JobView:
    view = fold([_created(), *events])
    assert view is not None
    return view


def _holds(n: int) -> list[JobEvent]:
    return [
        JobHeld(job_id=JOB, at_ms=T0 + i, reason=HoldReason.BUSY, retry_at_ms=T0 + 100 + i) for i in range(1, n + 1)
    ]


async def _create(store: JobStore) -> str:
    created = await store.create(_created(), _view())
    assert created.created
    return created.snapshot.last_id


async def test_a_create_tells_every_replica_its_job_joined_the_line(store: JobStore, redis: Redis) -> None:
    heard: list[str | None] = []
    listening = asyncio.Event()

    async def listen() -> None:
        async for message in signals.nudges(redis, subscribed=listening.set):
            heard.append(signals.joined(message))
            return

    listener = asyncio.create_task(listen())
    await asyncio.wait_for(listening.wait(), 10)
    await _create(store)
    await asyncio.wait_for(listener, 5)
    assert heard == [JOB]


async def test_create_claims_the_job_once(store: JobStore, redis: Redis) -> None:
    first = await store.create(_created(), _view())
    second = await store.create(_created(body='{"input":"other"}'), fold([_created(body='{"input":"other"}')]))  # type: ignore[arg-type]
    assert (first.created, second.created) == (True, False)
    assert second.snapshot.view == first.snapshot.view
    assert await redis.xlen(keys.events(JOB)) == 1
    assert await redis.pttl(keys.events(JOB)) == -1  # a job that has not ended never expires (SPEC S3.6)
    assert await redis.pttl(keys.view(JOB)) == -1


async def test_append_stores_the_events_and_their_view(store: JobStore, redis: Redis) -> None:
    last = await _create(store)
    events = _holds(2)
    ids = await store.append(JOB, events, _view(*events), expected_last_id=last)
    assert len(ids) == 2 and ids[0] > last
    history = await store.read(JOB)
    assert [event for _, event in history] == [_created(), *events]
    assert [entry_id for entry_id, _ in history[1:]] == ids
    snapshot = await store.load(JOB)
    assert snapshot is not None
    assert (snapshot.view, snapshot.last_id) == (_view(*events), ids[-1])
    assert await store.read(JOB, after=ids[0]) == history[2:]


async def test_append_without_an_expected_id_does_not_check(store: JobStore) -> None:
    await _create(store)
    await store.append(JOB, _holds(1), _view(*_holds(1)), expected_last_id=None)
    assert len(await store.read(JOB)) == 2


async def test_a_stale_expected_id_conflicts_and_appends_nothing(store: JobStore, redis: Redis) -> None:
    # Given a writer that appended after we read
    stale = await _create(store)
    [current] = await store.append(JOB, _holds(1), _view(*_holds(1)), expected_last_id=stale)
    # When we append expecting the old last id
    with pytest.raises(StreamConflict) as caught:
        await store.append(JOB, _holds(3), _view(*_holds(3)), expected_last_id=stale)
    # Then nothing was written and the error says where the stream is
    assert caught.value.actual_last_id == current
    assert await redis.xlen(keys.events(JOB)) == 2
    assert decode_view((await redis.hgetall(keys.view(JOB)))["state"]) == _view(*_holds(1))


async def test_a_wrong_lease_token_is_fenced_and_appends_nothing(store: JobStore, redis: Redis) -> None:
    last = await _create(store)
    await redis.set(keys.lease(JOB), "token-a", px=10_000)
    accepted = [RunAccepted(job_id=JOB, at_ms=T0 + 5, attempt=1, hermes_run_id="run_1")]
    with pytest.raises(LeaseLost):
        await store.append(JOB, accepted, _view(*accepted), expected_last_id=last, lease_token="token-b")
    await redis.delete(keys.lease(JOB))
    with pytest.raises(LeaseLost):
        await store.append(JOB, accepted, _view(*accepted), expected_last_id=last, lease_token="token-a")
    assert await redis.xlen(keys.events(JOB)) == 1
    # And the holder of the lease writes
    await redis.set(keys.lease(JOB), "token-a", px=10_000)
    await store.append(JOB, accepted, _view(*accepted), expected_last_id=last, lease_token="token-a")
    assert await redis.xlen(keys.events(JOB)) == 2


async def test_appending_to_a_missing_job_fails_and_creates_nothing(store: JobStore, redis: Redis) -> None:
    stop = [StopRequested(job_id=JOB, at_ms=T0)]
    with pytest.raises(JobNotFound):
        await store.append(JOB, stop, _view(*stop), expected_last_id=None)
    assert await redis.exists(keys.events(JOB), keys.view(JOB)) == 0
    assert await store.load(JOB) is None
    assert await store.read(JOB) == []


async def test_one_append_of_many_events_is_one_atomic_write(store: JobStore, redis: Redis) -> None:
    # Given a job, and another writer racing with batches of 50 events
    last = await _create(store)
    batch = _holds(50)
    ids = await store.append(JOB, batch, _view(*batch), expected_last_id=last)
    # Then the batch is contiguous in the stream: no other entry falls between its ids
    entries = await redis.xrange(keys.events(JOB), min=ids[0], max=ids[-1])
    assert [entry_id for entry_id, _ in entries] == ids
    assert (await store.load(JOB)).last_id == ids[-1]  # type: ignore[union-attr]
    # And a conflicting batch leaves no trace at all
    with pytest.raises(StreamConflict):
        await store.append(JOB, batch, _view(*batch), expected_last_id=last)
    assert await redis.xlen(keys.events(JOB)) == 51


async def test_a_job_has_no_ttl_until_it_ends_then_expires_retention_after_its_end(
    store: JobStore, redis: Redis
) -> None:
    # Given a created, then accepted job (SPEC S3.6: nothing of a job expires while it lives)
    last = await _create(store)
    accepted = RunAccepted(job_id=JOB, at_ms=T0 + 1, attempt=1, hermes_run_id="run_1")
    [last] = await store.append(JOB, [accepted], _view(accepted), expected_last_id=last, before=_view())
    assert await redis.pttl(keys.events(JOB)) == -1 and await redis.pttl(keys.view(JOB)) == -1
    # When it ends
    done = JobFinished(job_id=JOB, at_ms=T0 + 2, status=JobStatus.COMPLETED, attempt=1, output="o")
    await store.append(JOB, [done], _view(accepted, done), expected_last_id=last, before=_view(accepted))
    # Then its stream and view expire RUNS_RETENTION after that write
    for key in (keys.events(JOB), keys.view(JOB)):
        assert 50_000 < await redis.pttl(key) <= 60_000


async def test_a_live_job_of_an_older_store_loses_the_ttl_it_was_given_at_its_next_activity(
    store: JobStore, redis: Redis
) -> None:
    # Given a job written by a broker that renewed a TTL on every append (today's main)
    last = await _create(store)
    await redis.pexpire(keys.events(JOB), 5_000)
    await redis.pexpire(keys.view(JOB), 5_000)
    # When a write moves it in the listing (a hold here)
    await store.append(JOB, _holds(1), _view(*_holds(1)), expected_last_id=last, before=_view())
    # Then it has no TTL any more: it cannot expire while it waits or runs
    assert await redis.pttl(keys.events(JOB)) == -1 and await redis.pttl(keys.view(JOB)) == -1


async def test_a_finished_job_of_an_older_store_keeps_its_ttl(store: JobStore, redis: Redis) -> None:
    # Given a finished job written by today's main (TTL renewed on its last append)
    last = await _create(store)
    done = JobFinished(job_id=JOB, at_ms=T0 + 2, status=JobStatus.CANCELLED, error_code="stopped")
    await store.append(JOB, [done], _view(done), expected_last_id=last, before=_view())
    await redis.pexpire(keys.events(JOB), 5_000)
    await redis.pexpire(keys.view(JOB), 5_000)
    # When anything reads it, or a late write reaches it
    await store.load(JOB)
    # Then it still expires
    assert 0 < await redis.pttl(keys.events(JOB)) <= 5_000 and 0 < await redis.pttl(keys.view(JOB)) <= 5_000


async def test_a_created_and_a_finished_job_stream_hold_no_room_for_more(store: JobStore, redis: Redis) -> None:
    # Redis 7 reserves about 4 KB at the end of a stream's newest node; the job write gives it back when the
    # stream goes quiet (a create, a terminal write), keeping ids, last id and TTL.
    body = '{"input":"' + "x" * 700 + '"}'
    created = _created(body=body)
    view = fold([created])
    assert view is not None
    first = (await store.create(created, view)).snapshot.last_id
    assert await redis.memory_usage(keys.events(JOB)) < 2_048
    events: list[JobEvent] = [RunAccepted(job_id=JOB, at_ms=T0 + 1, attempt=1, hermes_run_id="run_1")]
    events += [
        HermesEventRecorded(job_id=JOB, at_ms=T0 + 2, attempt=1, hermes_run_id="run_1", name="message.delta",
                            payload='{"event":"message.delta","delta":"' + "y" * 150 + '"}')
        for _ in range(20)
    ]  # fmt: skip
    view = fold(events, view)
    assert view is not None
    ids = await store.append(JOB, events, view, expected_last_id=first)
    finished = JobFinished(job_id=JOB, at_ms=T0 + 3, status=JobStatus.COMPLETED, attempt=1, output="done")
    done = fold([finished], view)
    assert done is not None and done.status.terminal
    [last] = await store.append(JOB, [finished], done, expected_last_id=ids[-1], before=view)
    tight = keys.scratch(keys.partition_of(JOB))  # a copy of a stream holds no reserve
    await redis.copy(keys.events(JOB), tight)
    assert await redis.memory_usage(keys.events(JOB)) <= await redis.memory_usage(tight) + 100  # + its longer name
    await redis.delete(tight)
    assert 0 < await redis.pttl(keys.events(JOB)) <= 60_000  # the compaction keeps the TTL the end gave it
    assert [entry_id for entry_id, _ in await store.read(JOB)] == [first, *ids, last]
    # And a later append (a repair, say) still gets a later id
    [after] = await store.append(JOB, _holds(1), done, expected_last_id=last)
    assert after > last


async def test_an_unreadable_view_is_refolded_from_the_stream(store: JobStore, redis: Redis) -> None:
    last = await _create(store)
    [held] = await store.append(JOB, _holds(1), _view(*_holds(1)), expected_last_id=last)
    await redis.hset(keys.view(JOB), "state", '{"written_by":"a newer replica"}')
    snapshot = await store.load(JOB)
    assert snapshot is not None
    assert (snapshot.view, snapshot.last_id) == (_view(*_holds(1)), held)


async def _commands(redis: Redis) -> dict[str, int]:
    stats = await redis.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(value["calls"]) for name, value in stats.items()}


async def test_a_write_that_changes_neither_status_nor_updated_at_leaves_the_listing_alone(
    store: JobStore, redis: Redis, backend: str
) -> None:
    if backend == "cluster":
        pytest.skip("counts the commands of one Redis (INFO commandstats)")
    # Given an accepted job (message deltas move neither its status nor its updated_at, as in Hermes)
    last = await _create(store)
    accepted = RunAccepted(job_id=JOB, at_ms=T0 + 1, attempt=1, hermes_run_id="run_1")
    running = _view(accepted)
    [last] = await store.append(JOB, [accepted], running, expected_last_id=last, before=_view())
    delta = HermesEventRecorded(
        job_id=JOB, at_ms=T0 + 2, attempt=1, hermes_run_id="run_1", name="message.delta", payload="{}"
    )
    # When a batch of deltas is appended
    await redis.config_resetstat()
    await store.append(JOB, [delta, delta], fold([delta, delta], running), expected_last_id=last, before=running)  # type: ignore[arg-type]
    # Then the write touched no listing index: only the stream, the view and retention
    calls = await _commands(redis)
    assert "zadd" not in calls and "zrem" not in calls and calls["xadd"] == 2
    assert await redis.zscore(keys.runs_index(keys.partition_of(JOB), "running"), JOB) == T0 + 1


async def test_a_store_that_cannot_read_at_start_still_takes_creates_once_redis_answers(redis: Redis) -> None:
    # Given a store whose Redis does not answer yet (a cluster node down as the replica starts)
    nobody = Redis(port=free_port(), retry=Retry(NoBackoff(), 0))
    await JobStore(nobody, retention_ms=60_000).warm(1_000)  # Then reading ahead of creates does not stop the replica
    await nobody.aclose()
    # And a store that read ahead creates as before
    store = JobStore(redis, retention_ms=60_000)
    await store.warm(1_000)
    created = await store.create(_created("job_warm"), _view(_created("job_warm")))
    assert created.created
