"""remove_deltas.lua works in bounded slices (SPEC S3.6): each call reads SLICE entries of the stream at most, so no
call grows with the job (its time is in scripts/bench.py's figures: SLOWLOG of a 100,000-entry job); readers see
the whole stream until the last call swaps in the copy; a crash part-way is carried on by a later sweep; a
replica of the previous broker, whose script removes them in one call, can run beside.

The bound is asserted as a count (each call's progress in `deltas_at` and its copy), not as a time: this machine's
neighbours make SLOWLOG durations noisy, and the count is what makes the time bounded."""

from __future__ import annotations

from pathlib import Path

from redis.asyncio import Redis

from broker.store import keys
from broker.store.deltas import SLICE, DeltaSchedule
from broker.store.scripts import Scripts

JOB = "job_" + "c" * 32
PARTITION = keys.partition_of(JOB)
TTL_MS = 3_600_000
DELTA = '[1,1,"word "]'  #: a packed message.delta (broker/codec.py)
TOOL = '[1,"tool.started",{"tool":"x"}]'  #: a packed event that is no delta
PREVIOUS = (Path(__file__).parent / "previous" / "remove_deltas.lua").read_text()  #: the previous main's script


async def _finished_job(redis: Redis, entries: int, kept_every: int = 10) -> list[tuple[str, str]]:
    """A finished job's stream of `entries` entries (deltas, every `kept_every`-th another event), its view hash
    and its deltas due: the (id, value) of every entry."""
    events = keys.events(JOB)
    await redis.xadd(events, {"e": '{"type":"JobCreated"}'})
    for start in range(0, entries - 2, 5_000):
        async with redis.pipeline(transaction=False) as pipe:
            for i in range(start, min(start + 5_000, entries - 2)):
                pipe.xadd(events, {"e": TOOL if i % kept_every == 0 else DELTA})
            await pipe.execute()
    last = await redis.xadd(events, {"e": '{"type":"JobFinished","output":"out"}'})
    await redis.pexpire(events, TTL_MS)
    await redis.hset(keys.view(JOB), mapping={"state": '{"output":"out"}', "last_id": last})  # type: ignore[misc]
    await redis.zadd(keys.deltas(PARTITION), {JOB: 1})
    return [(entry_id, fields["e"]) for entry_id, fields in await redis.xrange(events)]


async def _slice(redis: Redis) -> int:
    script_keys = [keys.events(JOB), keys.view(JOB), keys.deltas(PARTITION), keys.compact(JOB)]
    scripts = Scripts(redis)
    return int(await scripts.run(scripts.remove_deltas, keys=script_keys, args=[JOB, 10, "", "", SLICE]))  # type: ignore[arg-type]


async def _stream(redis: Redis) -> list[tuple[str, str]]:
    return [(entry_id, fields["e"]) for entry_id, fields in await redis.xrange(keys.events(JOB))]


def _order(entry_id: str) -> tuple[int, ...]:
    return tuple(int(part) for part in entry_id.split("-"))


def _kept(entries: list[tuple[str, str]]) -> list[tuple[str, str]]:
    return [(entry_id, value) for entry_id, value in entries if value != DELTA]


async def test_a_100k_entry_job_loses_its_deltas_in_calls_of_one_slice_each(redis: Redis) -> None:
    # Given a finished job of 100,000 entries, nine in ten of them deltas
    entries = await _finished_job(redis, 100_000)
    last_id = (await redis.xinfo_stream(keys.events(JOB)))["last-generated-id"]
    calls = 0
    # When its deltas are removed call by call
    while (answer := await _slice(redis)) == -2:
        calls += 1
        # Then each call read the next SLICE entries (no more), copied those that are no delta, and left the
        # stream whole for readers
        read = entries[: calls * SLICE]
        assert await redis.hget(keys.view(JOB), "deltas_at") == read[-1][0]  # type: ignore[misc]
        assert await redis.xlen(keys.compact(JOB)) == len(_kept(read))
        if calls % 97 == 1:
            assert await _stream(redis) == entries
            assert 0 < await redis.pttl(keys.compact(JOB)) <= TTL_MS
    # And the last call swapped the copy in: every other entry under its own id, the last id, the TTL kept
    assert calls == len(entries) // SLICE
    assert answer == len(entries) - len(_kept(entries)) == 89_998
    assert await _stream(redis) == _kept(entries)
    assert (await redis.xinfo_stream(keys.events(JOB)))["last-generated-id"] == last_id
    assert 0 < await redis.pttl(keys.events(JOB)) <= TTL_MS
    view = await redis.hgetall(keys.view(JOB))  # type: ignore[misc]
    assert view["deltas_removed"] == str(answer) and "deltas_at" not in view
    assert not await redis.exists(keys.compact(JOB)) and await redis.zscore(keys.deltas(PARTITION), JOB) is None
    # And a resume from a removed delta's id starts strictly after it
    removed = entries[5_003][0]
    assert entries[5_003][1] == DELTA
    after = await redis.xrange(keys.events(JOB), min=f"({removed}")
    assert [entry_id for entry_id, _ in after] == [i for i, _ in _kept(entries) if _order(i) > _order(removed)]


async def test_a_crash_part_way_is_carried_on_by_a_later_sweep(redis: Redis) -> None:
    # Given a job whose deltas a replica began to remove, and died after three calls
    entries = await _finished_job(redis, 3 * SLICE + 100)
    assert [await _slice(redis) for _ in range(3)] == [-2, -2, -2]
    # Then readers still see the whole stream, and the job is still due
    assert await _stream(redis) == entries
    assert await redis.zscore(keys.deltas(PARTITION), JOB) is not None
    # When a later sweep (any replica's) looks at the schedule
    assert await DeltaSchedule(redis).remove(await DeltaSchedule(redis).due(10), 10) == [
        len(entries) - len(_kept(entries))
    ]
    # Then it finished the job: the entries that are no delta, each once, and nothing left over
    assert await _stream(redis) == _kept(entries)
    assert not await redis.exists(keys.compact(JOB))
    assert await redis.hget(keys.view(JOB), "deltas_at") is None  # type: ignore[misc]


async def test_the_previous_brokers_script_beside_leaves_one_consistent_removal(redis: Redis) -> None:
    script_keys = [keys.events(JOB), keys.view(JOB), keys.deltas(PARTITION), keys.scratch(PARTITION)]
    # Given a job part-way through this version's slices
    entries = await _finished_job(redis, 2 * SLICE + 10)
    assert await _slice(redis) == -2
    # When a replica of the previous broker removes its deltas in its one call (it takes the job off the schedule)
    removed = await redis.eval(PREVIOUS, 4, *script_keys, JOB, 10, "", "")  # type: ignore[misc]
    assert removed == len(entries) - len(_kept(entries))
    # Then this version's next call finds the job not due, and drops its copy: counted once, nothing left over
    assert await _slice(redis) == -1
    assert await _stream(redis) == _kept(entries)
    assert not await redis.exists(keys.compact(JOB))
    view = await redis.hgetall(keys.view(JOB))  # type: ignore[misc]
    assert view["deltas_removed"] == str(removed) and "deltas_at" not in view
    # And the other way round: after this version's last call, the previous script finds nothing due
    await redis.delete(keys.events(JOB), keys.view(JOB))
    entries = await _finished_job(redis, 2 * SLICE + 10)
    assert await DeltaSchedule(redis).remove([JOB], 10) == [len(entries) - len(_kept(entries))]
    assert await redis.eval(PREVIOUS, 4, *script_keys, JOB, 10, "", "") == -1  # type: ignore[misc]
    assert await _stream(redis) == _kept(entries)
