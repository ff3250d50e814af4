"""Steps 2 and 3 of an admission pass (broker/store/admission.py): read the heads of the partition lines and claim
the first of them, each with its run lease.

A pass reads every partition's line at most every FULL_READ_MS; in between, only the lines that may have changed since
this replica read them (broker/admission/heads.py keeps their first jobs): a job joined (a `line J` message, which
the create's write and `enter` publish to every replica), or a head it tried to claim was gone (another replica took
it: the pass reads that line again and claims on, CLAIM_ROUNDS at most), or the pass needs more of a long line than
it knows. Heads that share a score are ordered by arrival (admission_ties.lua, one more round trip only then). Each
claim is admission_claim.lua in the job's slot (off the line, its run lease taken, due for takeover, its view read),
all of a round in one pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from redis.asyncio import Redis

from broker.admission import fair
from broker.admission.heads import DEPTH, KnownHeads
from broker.codec import decode_view
from broker.logging import get_logger
from broker.store import keys, signals
from broker.store.leases import new_token
from broker.store.outage import is_outage
from broker.store.replies import ints_and_ids as _ints_and_ids
from broker.store.replies import scored as _scored
from broker.store.replies import text as _text
from broker.store.scripts import Scripts, run_many
from projections.job import JobView

#: How often a pass reads every partition's line (else only those known to hold waiting jobs).
FULL_READ_MS = 500
#: How often a full read also looks for counts of waiting jobs left beside an empty line (an older broker's drift).
DRIFT_CHECK_MS = 10_000
#: Parked jobs one look for drift puts back in each partition's line at most (the next look takes more).
UNPARK_MOST = 1_000
#: Claim rounds of one pass at most: a head known here that is gone sends the pass back to read its line.
CLAIM_ROUNDS = 3


#: A claimed job: (job, lease token, stored view fields, JobCreated JSON, place, view).
Claimed = tuple[str, str, dict[str, str], str | None, str, JobView | None]


def claimed_of(job_id: str, lease_token: str, claimed: list[object]) -> Claimed:
    """A claimed job from admission_claim.lua's reply."""
    stored = {
        name: _text(value)
        for name, value in zip(("state", "last_id", "board"), claimed[2:5], strict=False)
        if value is not None
    }
    created = _text(claimed[5]) if len(claimed) > 5 and claimed[5] is not None else None
    view = decode_view(stored["state"]) if "state" in stored else None
    return (job_id, lease_token, stored, created, _text(claimed[1]), view)


class LineClaims:
    """What this replica knows of the lines, and its claims of their heads."""

    def __init__(self, redis: Redis, scripts: Scripts, replica: str, ttl_ms: int) -> None:
        self._redis = redis
        self._scripts = scripts
        self._replica = replica  #: the lease tokens of its claims name it (SPEC S3.2 `owner`)
        self._ttl_ms = ttl_ms  #: a claimed job's run lease (RUNS_LEASE)
        self._known = KnownHeads()  #: the lines' first jobs as last read here, and which lines changed since
        self._full_read_at = -FULL_READ_MS  #: when a pass last read every partition (epoch ms)
        self._drift_checked_at = -DRIFT_CHECK_MS
        self.drifted: list[int] = []  #: partitions read with an empty line but counts of waiting jobs

    def full(self, now_ms: int) -> bool:
        """Is a read of every line due?"""
        return now_ms - self._full_read_at >= FULL_READ_MS

    def read_all_at(self, now_ms: int) -> None:
        self._full_read_at = now_ms

    def any_waiting(self) -> bool:
        return self._known.any_waiting()

    def changed(self, partition: int) -> None:
        self._known.changed(partition)

    def smallest(self, priority: int) -> int | None:
        """The smallest tag of `priority` known to wait here."""
        return fair.smallest(self._known.scores(), priority)

    def charged(self, job_id: str) -> bool:
        """Was the job charged its key's turn by the latest claim (its key's next job)? Never here: a key's places are
        fixed at its creates, in its order."""
        return False

    def started(self, job_id: str, place: str) -> str:
        """Where a job the latest claim took starts in its priority's virtual time (what V moves past, and where a
        slot given back puts it): its place."""
        return place

    async def claim(self, most: int, parked: set[str], now_ms: int, *, full: bool) -> list[Claimed]:
        """Claim up to `most` heads of the lines (none of `parked`); a known head that is gone (another replica took
        it, or it was stopped) sends the pass back to read its line, CLAIM_ROUNDS times at most."""
        taken: list[Claimed] = []
        tried: set[str] = set()
        for attempt in range(CLAIM_ROUNDS):
            wanted = most - len(taken)
            skipped = parked | tried
            read = await self._heads(wanted + len(skipped), now_ms, full=full and attempt == 0)
            heads = [head for head in read if head[0] not in skipped][:wanted]
            if not heads:
                break
            claims = await run_many(self._redis, self._scripts.admission_claim, self._claim_calls(heads, now_ms))
            lost = False
            for (job_id, lease_token, partition), claim in zip(heads, claims, strict=True):
                claimed = cast(list[object], claim)
                tried.add(job_id)
                if claimed[0] == 1:
                    taken.append(claimed_of(job_id, lease_token, claimed))
                    self._known.taken(job_id, partition, gone=False)
                elif claimed[0] == 0:  # not in the line any more: another replica took it, or it was stopped
                    self._known.taken(job_id, partition, gone=True)
                    lost = True
                # -1: another replica drives it (it stays in the line): not granted here
            if not lost or len(taken) >= most:
                break
        return taken

    async def _heads(self, most: int, now_ms: int, *, full: bool) -> list[tuple[str, str, int]]:
        """The first `most` waiting jobs over the lines, in line order, as (job, a new lease token, partition): the
        lines read are every line (`full`), or those that may have changed since this replica last read them
        (broker/admission/heads.py). When jobs of one score are among the heads it reaches, one more read orders
        them by arrival (their created ms)."""
        read = list(keys.partitions()) if full else self._known.to_read(most)
        depth = max(most, DEPTH)
        if full and now_ms - self._drift_checked_at >= DRIFT_CHECK_MS:
            try:
                await self._unpark()
            except Exception as error:  # the line's own read below says whether Redis answers; the next look retries
                if not is_outage(error):
                    get_logger(type(self)).error("Could not put parked jobs back in the line.", exc_info=error)
        if read:
            self._known.reading(read)
            async with self._redis.pipeline(transaction=False) as pipe:
                for partition in read:  # raw: redis-py's pairing of scores cost more than the read itself
                    pipe.execute_command("ZRANGE", keys.line(partition), 0, depth - 1, "WITHSCORES")
                replies = await pipe.execute()
            lines = {partition: _scored(reply) for partition, reply in zip(read, replies, strict=True)}
            for partition, line in lines.items():
                self._known.read(partition, line, depth)
            if full and now_ms - self._drift_checked_at >= DRIFT_CHECK_MS:
                self._drift_checked_at = now_ms
                await self._check_drift([partition for partition, line in lines.items() if not line])
        merged = self._known.merged(most)
        tied = fair.tied_at_cut(merged, most)
        if tied:  # jobs of one tag (keys without a turn, between two grants) among the heads: the oldest go first
            merged = await self._by_arrival(merged, tied, most)
        return [(job_id, new_token(self._replica), partition) for _, job_id, partition in merged[:most]]

    async def _unpark(self) -> None:
        """Jobs parked behind their keys' fronts by a replica under ADMISSION_FAIRNESS_COST time or tokens (SPEC S4.2)
        are read by cost-aware passes only: one counting every other one (`runs`) puts them back in the line, in their
        keys' order (fair_unpark.lua), when it looks for drift."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for partition in keys.partitions():
                pipe.zcard(keys.parked(partition))
            counts = await pipe.execute()
        parked = [partition for partition, n in zip(keys.partitions(), counts, strict=True) if n]
        unpark: list[str | int] = [UNPARK_MOST, keys.SIGNALS, signals.JOINED]
        calls = [([keys.line(p), keys.parked(p), keys.fronts(p)], unpark) for p in parked]
        await run_many(self._redis, self._scripts.fair_unpark, calls)
        for partition in parked:
            self._known.changed(partition)

    async def _check_drift(self, empty: list[int]) -> None:
        """Remember the partitions read with an empty line but counts of waiting jobs (cleared after the pass)."""
        if not empty:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for partition in empty:
                pipe.exists(keys.fair(partition))
            counted = await pipe.execute()
        self.drifted = [partition for partition, n in zip(empty, counted, strict=True) if n]

    def _claim_calls(
        self, heads: Sequence[tuple[str, str, int]], now_ms: int
    ) -> list[tuple[list[str], list[str | int]]]:
        ttl = self._ttl_ms
        return [
            (
                [
                    keys.line(partition),
                    keys.lease(job_id),
                    keys.due(partition),
                    keys.view(job_id),
                    keys.events(job_id),
                    keys.fair(partition),
                    keys.fair_top(partition),
                ],
                [job_id, lease_token, ttl, now_ms + ttl],
            )
            for job_id, lease_token, partition in heads
        ]

    async def _by_arrival(self, merged: list[fair.Head], tied: list[fair.Head], most: int) -> list[fair.Head]:
        """`merged` with the jobs of the tied score in arrival order (created ms): the oldest `most` of that score
        in each partition that holds some (a line's read showed the smallest ids only), one script per partition."""
        score = tied[0][0]
        partitions = sorted({partition for _, _, partition in tied})
        calls: list[tuple[list[str], list[str | int]]] = [
            ([keys.line(p), keys.arrivals(p)], [repr(score), most]) for p in partitions
        ]
        arrived: dict[str, float | None] = {}
        found: list[fair.Head] = []
        replies = await run_many(self._redis, self._scripts.admission_ties, calls)
        for partition, reply in zip(partitions, replies, strict=True):
            items = _ints_and_ids(reply)
            for job_id, at in zip(items[::2], items[1::2], strict=True):
                arrived[job_id] = float(at) if at else None
                found.append((score, job_id, partition))
        others = [head for head in merged if head[0] != score]
        return fair.by_arrival(others + found, arrived)
