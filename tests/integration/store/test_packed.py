"""Packed relayed events against a real Redis (SPEC S3.6): a job stored packed reads, resumes, folds and rebuilds
exactly as the same job stored in full (as today's main stores it), and today's main's decoder reads every
full entry the same and skips packed ones without failing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from redis.asyncio import Redis

from broker.board.projector import BoardSettings
from broker.codec import encode
from broker.events import (
    HermesEventRecorded,
    JobCreated,
    JobEvent,
    JobFinished,
    JobStatus,
    RunAccepted,
    RunInterrupted,
    RunResubmitted,
)
from broker.http.hub import frames
from broker.rebuild import RebuildSettings, compare
from broker.store import keys
from broker.store.deltas import DeltaSchedule
from broker.store.entries import EventFormat, set_format, settle_fresh_store
from broker.store.jobs import JobStore
from broker.store.rebuild import RebuildStore
from projections.job import JobView, fold
from tests.conftest import BOTH_BACKENDS

pytestmark = BOTH_BACKENDS

JOB = "job_33333333333333333333333333333333"
T0 = 1_796_005_747_391
OLD_MAIN = "ff28a16"
SETTINGS = RebuildSettings(
    board=BoardSettings(platform="runs", ttl_ms=3_600_000, refresh_ms=60_000), board_enabled=False
)


def _hermes(attempt: int, run_id: str, name: str, at: int, **fields: object) -> HermesEventRecorded:
    payload = {"event": name, "run_id": run_id, "timestamp": (at - 3) / 1000, **fields}
    return HermesEventRecorded(
        job_id=JOB, at_ms=at, attempt=attempt, hermes_run_id=run_id, name=name, payload=orjson.dumps(payload).decode()
    )


def _attempt(attempt: int, run_id: str, at: int) -> list[JobEvent]:
    """What a driver appends for one attempt: accepted, a tool, many deltas, the reasoning text."""
    events: list[JobEvent] = [RunAccepted(job_id=JOB, at_ms=at, attempt=attempt, hermes_run_id=run_id)]
    events.append(_hermes(attempt, run_id, "tool.started", at + 1, tool="terminal", preview="echo 1"))
    events.append(_hermes(attempt, run_id, "tool.completed", at + 2, tool="terminal", duration=0.01, error=False))
    events += [_hermes(attempt, run_id, "message.delta", at + 3 + i // 4, delta=f"d{i} ") for i in range(40)]
    events.append(_hermes(attempt, run_id, "reasoning.available", at + 20, text="d0 d1"))
    return events


def _history() -> list[list[JobEvent]]:
    """One job in writes: created; attempt 1 interrupted and resubmitted; attempt 2 completed."""
    created = JobCreated(job_id=JOB, at_ms=T0, body='{"input":"x"}', fingerprint="f" * 64)
    first = _attempt(1, "run_c60d1f216f794796a48b3c9af3e3dbb8", T0 + 10)
    lost = [
        RunInterrupted(job_id=JOB, at_ms=T0 + 40, attempt=1, hermes_run_id=first[0].hermes_run_id, reason="not_found"),  # type: ignore[union-attr]
        RunResubmitted(job_id=JOB, at_ms=T0 + 40, attempt=2),
    ]
    second = _attempt(2, "run_e2b0ecf495e3462387b3c3aadd68e42a", T0 + 50)
    done = JobFinished(job_id=JOB, at_ms=T0 + 90, status=JobStatus.COMPLETED, attempt=2, output="d0 d1")
    return [[created], first[:1], first[1:20], first[20:], lost, second[:30], [*second[30:], done]]


async def _write(store: JobStore) -> list[str]:
    writes = _history()
    view = fold(writes[0])
    assert view is not None
    created = await store.create(writes[0][0], view)  # type: ignore[arg-type]
    ids = [created.snapshot.last_id]
    for batch in writes[1:]:
        after: JobView | None = fold(batch, view)
        assert after is not None
        ids += await store.append(JOB, batch, after, expected_last_id=ids[-1], before=view)
        view = after
    return ids


async def _raw(redis: Redis) -> list[str]:
    return [fields[keys.EVENT_FIELD] for _, fields in await redis.xrange(keys.events(JOB))]


async def test_a_job_stored_packed_reads_as_the_same_job_stored_in_full(redis: Redis) -> None:
    # Given the same job written in full (as today's main writes it) and then packed
    full_ids = await _write(JobStore(redis, retention_ms=60_000, packed=False))
    full = await JobStore(redis, retention_ms=60_000).read(JOB)
    full_memory = await redis.memory_usage(keys.events(JOB))
    assert all(entry.startswith("{") for entry in await _raw(redis))
    await redis.delete(keys.events(JOB), keys.view(JOB))
    packed_ids = await _write(JobStore(redis, retention_ms=60_000, packed=True))
    raw = await _raw(redis)
    # Then every relayed Hermes event is packed, nothing else is, and the stream is far smaller
    history = [event for batch in _history() for event in batch]
    assert [entry.startswith("[") for entry in raw] == [isinstance(e, HermesEventRecorded) for e in history]
    assert not any(JOB in entry or "run_c60d1f" in entry for entry in raw if entry.startswith("["))
    assert await redis.memory_usage(keys.events(JOB)) < full_memory / 2
    # And a reader that never saw the job (no cache) reads the same events, and the same frames, byte for byte
    packed = await JobStore(redis, retention_ms=60_000).read(JOB)
    assert [event for _, event in packed] == [event for _, event in full] == history
    renumbered = [(full_ids[i], event) for i, (_, event) in enumerate(packed)]
    assert frames(JOB, renumbered) == frames(JOB, full)
    assert len(packed_ids) == len(full_ids)


@pytest.mark.parametrize("view_lost", [False, True])
async def test_a_resume_mid_stream_finds_each_attempts_run(redis: Redis, view_lost: bool) -> None:
    # Given a job stored packed over two attempts (and, in one case, its view hash lost: the stream decides)
    ids = await _write(JobStore(redis, retention_ms=60_000, packed=True))
    history = [event for batch in _history() for event in batch]
    if view_lost:
        await redis.delete(keys.view(JOB))
    # When fresh readers resume after any id (a delta of attempt 1, the resubmit, a delta of attempt 2)
    for position in (5, 30, 48, 60, len(ids) - 2):
        read = await JobStore(redis, retention_ms=60_000).read(JOB, after=ids[position], count=7)
        # Then they read exactly the events after it, with the run id of their own attempt
        assert [event for _, event in read] == history[position + 1 : position + 8]
        assert [entry_id for entry_id, _ in read] == ids[position + 1 : position + 8]


async def test_the_rebuild_reads_a_packed_job_as_its_stored_projections(redis: Redis) -> None:
    await _write(JobStore(redis, retention_ms=60_000, packed=True))
    stored = await RebuildStore(redis).read(JOB)
    assert [event for _, event in stored.history] == [event for batch in _history() for event in batch]
    assert compare(stored, SETTINGS, T0) is None


async def test_packing_is_on_for_a_fresh_store_and_off_for_a_used_one_until_switched(redis: Redis) -> None:
    # A store no broker has used: packing from the start
    assert await settle_fresh_store(redis) is True
    assert await EventFormat(redis).packed() is True
    # A store an older broker has used (its work stream exists): full entries until the switch
    await redis.delete(keys.EVENT_FORMAT)
    await redis.xadd(keys.WORK, {"line": "job_x"})
    assert await settle_fresh_store(redis) is False
    assert await EventFormat(redis).packed() is False
    await _write(JobStore(redis, retention_ms=60_000))
    assert all(entry.startswith("{") for entry in await _raw(redis))
    await set_format(redis, packed=True)
    assert await EventFormat(redis).packed() is True
    # An operator's pin wins over a startup, even on the embedded Redis (one broker only, else packed)
    await set_format(redis, packed=False)
    assert await settle_fresh_store(redis, only_replica=True) is False
    assert await EventFormat(redis).packed() is False
    await redis.delete(keys.EVENT_FORMAT)
    assert await settle_fresh_store(redis, only_replica=True) is True


@pytest.mark.parametrize("packed", [False, True])
async def test_deltas_are_removed_from_full_and_packed_streams_alike(redis: Redis, packed: bool) -> None:
    # Given a finished job stored in full (as today's main stores it) or packed, its deltas due for removal
    ids = await _write(JobStore(redis, retention_ms=60_000, packed=packed))
    history = [event for batch in _history() for event in batch]
    await redis.zadd(keys.deltas(keys.partition_of(JOB)), {JOB: 1})
    # When a replica's sweep runs
    removed = await DeltaSchedule(redis).remove(await DeltaSchedule(redis).due(2), 2)
    # Then exactly the deltas of both attempts are gone; every other event reads as before, under its own id
    kept = [
        (i, e)
        for i, e in zip(ids, history, strict=True)
        if not (isinstance(e, HermesEventRecorded) and e.name == "message.delta")
    ]
    assert removed == [len(history) - len(kept)] == [80]
    assert await JobStore(redis, retention_ms=60_000).read(JOB) == kept
    assert (await redis.xinfo_stream(keys.events(JOB)))["last-generated-id"] == ids[-1]
    assert await redis.hget(keys.view(JOB), "deltas_removed") == "80"


# -- today's main (ff28a16) reading what this version stores --------------------------------------------------

_OLD_READER = """
import sys, orjson
from broker.codec import decode, to_builtins
from projections.feed import payload
out = []
for line in sys.stdin.read().splitlines():
    event = decode(line)
    out.append([type(event).__name__, to_builtins(event) if type(event).__name__ != "UnknownEvent" else None,
                payload(sys.argv[1], event)])
print(orjson.dumps(out).decode())
"""


def _old_main(tmp_path: Path) -> Path:
    root = Path(__file__).resolve().parents[3]
    if (
        shutil.which("git") is None
        or subprocess.run(
            ["git", "-C", str(root), "cat-file", "-e", f"{OLD_MAIN}^{{commit}}"], capture_output=True
        ).returncode
    ):
        pytest.skip(f"needs git and commit {OLD_MAIN} (today's main) in the checkout")
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", OLD_MAIN, "broker/__init__.py", "broker/codec.py", "broker/events.py",
         "projections"],
        capture_output=True, check=True,
    ).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(tmp_path)], input=archive, check=True)
    return tmp_path


def _read_by_old_main(tmp_path: Path, entries: list[str]) -> list[list[object]]:
    done = subprocess.run(
        [sys.executable, "-c", _OLD_READER, JOB],
        input="\n".join(entries).encode(),
        capture_output=True,
        check=True,
        cwd=_old_main(tmp_path),
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
    )
    return list(orjson.loads(done.stdout))


async def test_todays_main_reads_full_entries_the_same_and_skips_packed_ones(redis: Redis, tmp_path: Path) -> None:
    history = [event for batch in _history() for event in batch]
    # Full entries of this version (what it writes until the store's switch allows packing)
    await _write(JobStore(redis, retention_ms=60_000, packed=False))
    old = _read_by_old_main(tmp_path, await _raw(redis))
    assert [name for name, _, _ in old] == [type(event).__name__ for event in history]
    assert [orjson.loads(encode(event)) for event in history] == [fields for _, fields, _ in old]
    # Packed entries (after the switch): read as unknown events, shown to no client, and nothing fails
    await redis.delete(keys.events(JOB), keys.view(JOB))
    await _write(JobStore(redis, retention_ms=60_000, packed=True))
    old = _read_by_old_main(tmp_path, await _raw(redis))
    for (name, _, shown), event in zip(old, history, strict=True):
        assert name == ("UnknownEvent" if isinstance(event, HermesEventRecorded) else type(event).__name__)
        assert shown is not None or isinstance(event, HermesEventRecorded)


async def test_the_operator_switches_packing_with_one_command(redis: Redis, redis_target: tuple[str, bool]) -> None:
    url, cluster = redis_target
    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "REDIS_URL": url, "REDIS_CLUSTER": str(cluster).lower(), "PYTHONPATH": str(root)}

    def command(*args: str) -> object:
        done = subprocess.run(
            [sys.executable, "scripts/event_format.py", *args], cwd=root, env=env, capture_output=True, check=True
        )
        return orjson.loads(done.stdout.splitlines()[-1])

    assert command() == {"packed": False, "lean": False}
    assert command("packed") == {"packed": True, "lean": False}
    assert await redis.get(keys.EVENT_FORMAT) == keys.PACKED
    assert command("lean") == {"packed": True, "lean": True}  # lean views (broker/store/lean.py)
    assert await redis.get(keys.VIEW_FORMAT) == keys.LEAN
    assert command("full") == {"packed": False, "lean": False}
    assert await redis.get(keys.EVENT_FORMAT) == keys.FULL
