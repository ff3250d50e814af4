"""The bounded line on the create path (SPEC S4.4): what append_events.lua needs to refuse a job past its key's
`waiting` quota or ADMISSION_MAX_WAITING, and, on a cluster, the count of the partitions it cannot see.

What is counted: a key's waiting jobs are its `n:` counts in the partitions' fair hashes (the figure /readyz shows
per key), all waiting jobs the lines' lengths and the jobs parked behind their keys' fronts (/readyz `queue_depth`).
- Single Redis: the job write itself sums the 64 partitions' counts (KEYS of the script, no slots there) before it
  writes anything: exact under any number of concurrent creates, and no round trip more.
- Cluster: one script sees one slot. The other partitions are read first (one pipeline: a round trip per master, in
  parallel), and the job write adds its own partition's count when it checks; `ClusterGuard` keeps a replica's own
  creates from crossing each other between the read and the write. What is left: creates of other replicas whose
  reads cross (see ClusterGuard).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import cast

from redis.asyncio import Redis

from broker.admission.quotas import Bound, Scope, full
from broker.errors import QueueFull
from broker.store import keys

Counted = tuple[int, int]  #: waiting jobs (of the key, in all) in the partitions the job write does not see


def fields(
    bound: Bound, fairness_key: str, first: int, partitions: Sequence[int], base: Counted, *, parked: bool = False
) -> dict[str, object]:
    """The write's `bound` field; the bound's KEYS start at index `first` (1-based): the fair hashes of `partitions`
    (with a key bound), then their lines (with a bound on all) and, with `parked`, their parked jobs."""
    written: dict[str, object] = {"name": fairness_key}
    at = first
    for scope, most, counted, per_partition in (
        ("key", bound.key, base[0], 1),
        ("all", bound.all, base[1], 1 + parked),
    ):
        if most:
            last = at + per_partition * len(partitions) - 1
            written[scope] = {"most": most, "base": counted, "first": at, "last": last}
            at = last + 1
    return written


def script_keys(bound: Bound, partitions: Sequence[int], *, parked: bool = False) -> list[str]:
    """The KEYS `fields` names, in its order: a bound on all counts the lines and, with `parked` (a cost-aware
    store: ADMISSION_FAIRNESS_COST time/tokens), the jobs parked behind their keys' fronts."""
    lines = [*(keys.line(p) for p in partitions), *(keys.parked(p) for p in partitions if parked)] if bound.all else []
    return [*(keys.fair(p) for p in partitions if bound.key), *lines]


def add(into: list[str], write: dict[str, object], bound: Bound, base: Counted, *, cluster: bool, job_id: str) -> None:
    """Add the bound to a create's job write: its `bound` field, and the KEYS it names after those `into` holds (a
    cost-aware create, one with a `cost` field, counts the parked jobs too)."""
    partitions = seen(cluster, job_id)
    fairness_key = cast(dict[str, str], write["fair"])["key"]
    parked = isinstance(write.get("cost"), dict)
    write["bound"] = fields(bound, fairness_key, len(into) + 1, partitions, base, parked=parked)
    into.extend(script_keys(bound, partitions, parked=parked))


def seen(cluster: bool, job_id: str) -> list[int]:
    """The partitions the job write counts itself: all on a single Redis, its own on a cluster."""
    return [keys.partition_of(job_id)] if cluster else list(keys.partitions())


async def elsewhere(
    redis: Redis, job_id: str, fairness_key: str, bound: Bound, *, pending: int = 0, parked: bool = False
) -> Counted:
    """Waiting jobs of the key and in all in every partition but the job's (with `parked`, a cost-aware store, the
    parked jobs too): one pipeline (on a cluster one round trip per master, in parallel), `pending` added to the count
    of all. Raise QueueFull when they reach a bound already."""
    own = keys.partition_of(job_id)
    others = [partition for partition in keys.partitions() if partition != own]
    async with redis.pipeline(transaction=False) as pipe:
        for partition in others:
            if bound.key:
                pipe.hget(keys.fair(partition), f"n:{fairness_key}")
            if bound.all:
                pipe.zcard(keys.line(partition))
                if parked:
                    pipe.zcard(keys.parked(partition))
        replies = cast(list[object], await pipe.execute())
    step = (1 if bound.key else 0) + ((1 + parked) if bound.all else 0)
    key_counts = replies[0::step] if bound.key else []
    all_counts = [n for i, n in enumerate(replies) if not bound.key or i % step] if bound.all else []
    counted = sum(int(cast(str, n) or 0) for n in key_counts), pending + sum(int(cast(int, n)) for n in all_counts)
    scope = full(bound, *counted)
    if scope is not None:
        raise refused(bound, scope, fairness_key)
    return counted


def refused(bound: Bound, scope: Scope | str, fairness_key: str) -> QueueFull:
    """The answer to a create that ran into `scope` (`key` or `all`)."""
    return QueueFull(scope, bound.key if scope == "key" else bound.all, fairness_key)


class ClusterGuard:
    """A replica's side of the bound on a cluster, where the check is a read and then the write: creates of one key
    take their turn one at a time through check and write, so a replica never passes a key's bound by itself (with
    R replicas creating for one key at once, the key's bound is passed by R - 1 at most). Creates of different keys
    never wait for each other: towards ADMISSION_MAX_WAITING each counts this replica's creates already past their
    check and not yet written (it may refuse a little early during a burst, never pass the bound by itself)."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}  #: a key's lock and its creates holding or awaiting it
        self._pending = 0  #: this replica's creates past the check of a bound on all, not yet written

    @contextlib.asynccontextmanager
    async def checked(
        self, redis: Redis, job_id: str, fairness_key: str, bound: Bound, *, parked: bool = False
    ) -> AsyncIterator[Counted]:
        """Check the bound against the partitions the job write does not see (`parked`: a cost-aware store); inside,
        write the job."""
        async with self._key(fairness_key if bound.key else None):
            ahead, mine = self._pending, 1 if bound.all else 0
            self._pending += mine  # before the read: creates that read meanwhile count this one
            try:
                yield await elsewhere(redis, job_id, fairness_key, bound, pending=ahead, parked=parked)
            finally:
                self._pending -= mine

    @contextlib.asynccontextmanager
    async def _key(self, fairness_key: str | None) -> AsyncIterator[None]:
        if fairness_key is None:
            yield
            return
        lock, users = self._locks.get(fairness_key, (asyncio.Lock(), 0))
        self._locks[fairness_key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[fairness_key]
            if users == 1:
                del self._locks[fairness_key]  # bounded: only keys with a create on its way
            else:
                self._locks[fairness_key] = (lock, users - 1)
