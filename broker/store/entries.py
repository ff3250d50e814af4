"""Stored stream entries -> events, packed ones included (broker/codec.py), and the switch that lets this
replica write packed entries.

A packed entry leaves out its attempt's Hermes run id. A reader finds it, in this order: in a `RunAccepted` of
the same attempt earlier in what it read (a read from the start needs nothing else: the stream alone is the
truth), in its cache (an attempt is accepted once: `driver.decide.on_create`), in the job's view hash
(`run:<attempt>`, written by the job write that stored the entry), and last in the whole stream.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import cast

from redis.asyncio import Redis

from broker.codec import Packed, read_entry
from broker.events import JobEvent, RunAccepted
from broker.logging import get_logger
from broker.store import keys
from broker.store.outage import is_outage
from broker.tasks import SharedRead

Raw = Sequence[tuple[str, dict[str, str]]]
CACHED_RUNS = 65_536  #: (job, attempt) -> run id pairs a reader keeps
FORMAT_CHECK_S = 10.0  #: how often a writer looks at the switch (a change takes effect within this)


class Entries:
    """Decodes a job's raw stream entries; resolves packed ones (one HMGET when its cache lacks the run)."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._runs: OrderedDict[tuple[str, int], str] = OrderedDict()

    async def events(self, job_id: str, raw: Raw, known: dict[str, str] | None = None) -> list[tuple[str, JobEvent]]:
        """The events of `raw`, oldest first; `known`: the job's view hash, when the caller read it already."""
        read = [(entry_id, read_entry(fields.get(keys.EVENT_FIELD, ""), job_id)) for entry_id, fields in raw]
        if not any(isinstance(item, Packed) for _, item in read):
            return cast(list[tuple[str, JobEvent]], read)
        runs: dict[int, str] = {}
        accepted: set[int] = set()
        missing: set[int] = set()
        for _, item in read:  # the attempts neither the entries before them nor the cache name the run of
            if isinstance(item, RunAccepted):
                accepted.add(item.attempt)
            elif isinstance(item, Packed) and item.attempt not in accepted and (job_id, item.attempt) not in self._runs:
                missing.add(item.attempt)
        if missing:
            runs = await self._lookup(job_id, missing, known)
        events: list[tuple[str, JobEvent]] = []
        for entry_id, item in read:
            if isinstance(item, RunAccepted):
                runs[item.attempt] = item.hermes_run_id
            if isinstance(item, Packed):
                run_id = runs.get(item.attempt) or self._runs.get((job_id, item.attempt))
                if run_id is not None:
                    self._remember(job_id, item.attempt, run_id)
                events.append((entry_id, item.complete(run_id)))
            else:
                events.append((entry_id, item))
        return events

    async def _lookup(self, job_id: str, attempts: set[int], known: dict[str, str] | None) -> dict[int, str]:
        fields = [keys.run_field(attempt) for attempt in sorted(attempts)]
        if known is not None:
            values = [known.get(field) for field in fields]
        else:
            values = cast(list[str | None], await self._redis.hmget(keys.view(job_id), fields))
        runs = {attempt: value for attempt, value in zip(sorted(attempts), values, strict=True) if value}
        if len(runs) < len(attempts):  # the view is gone or older than the entry: the stream has the answer
            whole = cast(Raw, await self._redis.xrange(keys.events(job_id), "-", "+"))
            for _, fields_of in whole:
                accepted = read_entry(fields_of.get(keys.EVENT_FIELD, ""), job_id)
                if isinstance(accepted, RunAccepted) and accepted.attempt in attempts:
                    runs.setdefault(accepted.attempt, accepted.hermes_run_id)
        return runs

    def _remember(self, job_id: str, attempt: int, run_id: str) -> None:
        self._runs[(job_id, attempt)] = run_id
        self._runs.move_to_end((job_id, attempt))
        if len(self._runs) > CACHED_RUNS:
            self._runs.popitem(last=False)


class EventFormat:
    """Whether this replica may write packed entries: the store-wide switch `hbr:format` (see broker/codec.py
    for why it exists), looked at every FORMAT_CHECK_S; `fixed` pins it (tests, tools)."""

    def __init__(self, redis: Redis, fixed: bool | None = None) -> None:
        self._redis = redis
        self._fixed = fixed
        self._packed: bool | None = None  #: None: not looked at yet
        self._checked = 0.0
        self._looking: asyncio.Task[None] | None = None
        self._first_look: SharedRead[None] = SharedRead()

    async def packed(self) -> bool:
        if self._fixed is not None:
            return self._fixed
        if self._packed is None:  # one look for every write until it is back: they go on in the order they came
            await self._first_look(self._look)
        elif time.monotonic() - self._checked >= FORMAT_CHECK_S and self._looking is None:
            # Looked at behind the write's back: a write that waited for it would land after later writes
            self._looking = asyncio.create_task(self._look())
        return bool(self._packed)

    async def _look(self) -> None:
        try:
            self._checked = time.monotonic()
            self._packed = await self._redis.get(keys.EVENT_FORMAT) == keys.PACKED
        except Exception as error:
            if self._looking is None:
                raise  # the first look: the write cannot know its format
            if not is_outage(error):  # behind a write's back, in a task nobody awaits: nothing may escape
                get_logger(type(self)).error("Could not read the store's event format.", exc_info=error)
        finally:
            self._looking = None


async def settle_fresh_store(redis: Redis, *, only_replica: bool = False) -> bool:
    """At startup, before anything else is written, when nobody decided yet: a store no broker has used (no work
    stream), or one only this replica can reach (the embedded Redis), packs from now on: no older replica reads
    it. True when this call switched packing on."""
    if not only_replica and await redis.exists(keys.WORK):
        return False
    await redis.set(keys.VIEW_FORMAT, keys.LEAN, nx=True)  # lean views too (broker/store/lean.py)
    return bool(await redis.set(keys.EVENT_FORMAT, keys.PACKED, nx=True))


async def set_format(redis: Redis, packed: bool) -> None:
    """scripts/event_format.py: switch packing on (every replica reads packed entries) or pin it off, lean views
    too (before a rollback to a broker that does not read them)."""
    await redis.set(keys.EVENT_FORMAT, keys.PACKED if packed else keys.FULL)
    if not packed:
        await redis.set(keys.VIEW_FORMAT, keys.FULL)


async def set_lean(redis: Redis) -> None:
    """scripts/event_format.py: switch lean views on (every replica reads them, broker/store/lean.py)."""
    await redis.set(keys.VIEW_FORMAT, keys.LEAN)
