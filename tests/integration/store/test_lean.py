"""Lean views against a real Redis (issue 21, broker/store/lean.py): after the delta window a finished job's view
keeps its output only in its terminal entry, and reads, lists, replays and rebuilds as the view that held it (as
the previous main stored it); only with the store's switch on, and only when the entry holds that very output."""

from __future__ import annotations

import hashlib

import orjson
from redis.asyncio import Redis

from broker.events import HermesEventRecorded
from broker.rebuild import compare
from broker.store import keys, lean
from broker.store.deltas import DeltaSchedule
from broker.store.entries import set_format, set_lean, settle_fresh_store
from broker.store.jobs import JobStore
from broker.store.listing import Listing
from broker.store.rebuild import RebuildStore
from broker.store.scripts import Scripts
from tests.conftest import BOTH_BACKENDS
from tests.integration.store.test_packed import JOB, SETTINGS, T0, _history, _write

pytestmark = BOTH_BACKENDS

NOW = T0 + 10_000_000
RETENTION = 86_400_000


def _store(redis: Redis) -> JobStore:
    return JobStore(redis, retention_ms=RETENTION, packed=True, delta_retention_ms=1_000)


async def _finished(redis: Redis) -> list[str]:
    """The job of test_packed.py stored finished, as the previous main stores it (`state` with the output), its
    deltas due."""
    ids = await _write(_store(redis))
    assert await redis.zscore(keys.deltas(keys.partition_of(JOB)), JOB) is not None
    return ids


async def _seen(redis: Redis) -> tuple[object, ...]:
    """What readers make of the job: its snapshot, its listing page and the rebuild's verdict."""
    snapshot = await _store(redis).load(JOB)
    page = await Listing(redis, retention_ms=RETENTION).page(None, 10, None, T0 + 100)
    return snapshot, page.jobs, compare(await RebuildStore(redis).read(JOB), SETTINGS, T0 + 100)


async def _view_hash(redis: Redis) -> dict[str, str]:
    return await redis.hgetall(keys.view(JOB))  # type: ignore[misc,no-any-return]


async def test_the_view_keeps_its_output_once_and_reads_the_same(redis: Redis) -> None:
    # Given a finished job stored as the previous main stores it, and a store whose switch allows lean views
    ids = await _finished(redis)
    await set_lean(redis)
    before = await _seen(redis)
    assert before[0] is not None and before[0].view.output == "d0 d1" and before[2] is None  # type: ignore[attr-defined]
    state = (await _view_hash(redis))[keys.VIEW_STATE]

    # When its deltas are removed
    assert await DeltaSchedule(redis).remove([JOB], NOW) == [80]

    # Then its view hash holds the view without the output and the id of the terminal entry, no `state`
    stored = await _view_hash(redis)
    assert keys.VIEW_STATE not in stored and stored[keys.VIEW_OUTPUT_AT] == ids[-1]
    assert orjson.loads(stored[keys.VIEW_LEAN]) == {k: v for k, v in orjson.loads(state).items() if k != "output"}
    # And the job reads, lists and rebuilds as before
    assert await _seen(redis) == before
    # And a replayed create answers the job as it is
    created = await _store(redis).create(_history()[0][0], before[0].view)  # type: ignore[arg-type,attr-defined]
    assert not created.created and created.snapshot.view == before[0].view  # type: ignore[attr-defined]


async def test_a_later_write_stores_the_whole_view_again(redis: Redis) -> None:
    # Given a job whose view is lean
    ids = await _finished(redis)
    await set_lean(redis)
    await DeltaSchedule(redis).remove([JOB], NOW)
    snapshot = await _store(redis).load(JOB)
    assert snapshot is not None
    # When a late event is appended (a finished view absorbs it)
    late = HermesEventRecorded(
        job_id=JOB, at_ms=T0 + 95, attempt=2, hermes_run_id="run_x", name="tool.started", payload="{}"
    )
    await _store(redis).append(JOB, [late], snapshot.view, expected_last_id=ids[-1], before=snapshot.view)
    # Then `state` holds the whole view again, and it wins over the lean one left beside it
    stored = await _view_hash(redis)
    assert orjson.loads(stored[keys.VIEW_STATE])["output"] == "d0 d1"
    loaded = await _store(redis).load(JOB)
    assert loaded is not None and loaded.view == snapshot.view
    assert (await Listing(redis, retention_ms=RETENTION).page(None, 10, None, T0 + 100)).jobs == [snapshot.view]


async def test_without_the_switch_the_view_stays_whole(redis: Redis) -> None:
    # Given a store an older broker used (no switch), and one pinned full before a rollback
    for pin in (False, True):
        await redis.flushall()
        await _finished(redis)
        if pin:
            await set_lean(redis)
            await set_format(redis, packed=False)
        # When the job's deltas are removed, then its view keeps `state`, whole
        assert await DeltaSchedule(redis).remove([JOB], NOW) == [80]
        stored = await _view_hash(redis)
        assert keys.VIEW_LEAN not in stored and orjson.loads(stored[keys.VIEW_STATE])["output"] == "d0 d1"


async def test_a_view_changed_meanwhile_or_another_output_stays_whole(redis: Redis) -> None:
    # Given a finished job, its deltas due, and the lean view computed from its view as read
    await _finished(redis)
    state = (await _view_hash(redis))[keys.VIEW_STATE]
    lean_json, digest = lean.lean_args(state)
    assert lean_json and digest == hashlib.sha1(state.encode()).hexdigest()
    scripts = Scripts(redis)
    partition = keys.partition_of(JOB)
    script_keys = [keys.events(JOB), keys.view(JOB), keys.deltas(partition), keys.compact(JOB)]
    # When the view changed after it was read (another digest), or holds an output the terminal entry does not
    other = orjson.dumps({**orjson.loads(state), "output": "something else"}).decode()
    cases = [(state, "0" * 40), (other, hashlib.sha1(other.encode()).hexdigest())]
    for stored_state, sent_digest in cases:
        await redis.hset(keys.view(JOB), keys.VIEW_STATE, stored_state)  # type: ignore[misc]
        await redis.zadd(keys.deltas(partition), {JOB: 1})
        args = [JOB, NOW, lean_json, sent_digest, 1_000]  # one call: the job's stream is shorter than a slice
        assert await scripts.run(scripts.remove_deltas, keys=script_keys, args=args) >= 0
        # Then the view stays whole
        stored = await _view_hash(redis)
        assert keys.VIEW_LEAN not in stored and stored[keys.VIEW_STATE] == stored_state


async def test_the_switch_is_on_for_a_fresh_store_and_off_for_a_used_one(redis: Redis) -> None:
    # A store no broker has used: lean views from the start (as packed entries)
    assert await settle_fresh_store(redis) is True
    assert await lean.allowed(redis) is True
    # A store an older broker has used (its work stream exists): whole views until the operator's switch
    await redis.delete(keys.EVENT_FORMAT, keys.VIEW_FORMAT)
    await redis.xadd(keys.WORK, {"line": "job_x"})
    assert await settle_fresh_store(redis) is False
    assert await lean.allowed(redis) is False
    await set_lean(redis)
    assert await lean.allowed(redis) is True
