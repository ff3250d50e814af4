"""What the admission state and the lines say to observers (SPEC S3.8 `/readyz`, S4.1, S4.2, S10): the
figures of each upstream, the waiting jobs by priority, the keys with most waiting jobs, the oldest queued
job, and the virtual time a create needs. Reads only; the pass that writes is broker/store/admission.py."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from redis.asyncio import Redis

from broker.admission import fair
from broker.admission.route import Need
from broker.admission.state import LineState
from broker.events import JobStatus
from broker.store import keys
from broker.store.affinity import Affinity
from broker.store.replies import key_counts, scored
from broker.store.upstream_admission import UpstreamSlots, figures, need_of
from projections.job import JobView


async def read_line_state(
    redis: Redis, upstreams: Sequence[UpstreamSlots], now_ms: int, lost_ms: int, *, lines: bool = True
) -> LineState:
    """The shared figures; without `lines` the 64 lines are not read (`waiting` 0, `oldest_wait_ms`
    None): what a waiting job's hold needs is the limit, the live runs and the refusal. With them: the waiting
    jobs per priority band, the fairness keys with most waiting jobs, and the oldest queued job's age (the
    listing's queued index: a line's score is no time any more, SPEC S4.2), in one pipeline."""
    bands = [(fair.front(p), f"({fair.front(p + 1)}" if p < fair.PRIORITIES[-1] else "+inf") for p in fair.PRIORITIES]
    async with redis.pipeline(transaction=False) as pipe:
        for upstream in upstreams:  # one slot each (SPEC S10)
            pipe.hgetall(upstream.keys.state)
            pipe.zcount(upstream.keys.live, f"({now_ms}", "+inf")
        for partition in keys.partitions() if lines else ():
            line = keys.line(partition)
            pipe.zcount(line, "-inf", f"({fair.BASE}")  # ahead of the bands
            for low, high in bands:
                pipe.zcount(line, low, high)
            pipe.hgetall(keys.fair(partition))
            pipe.execute_command("ZRANGE", keys.runs_index(partition, JobStatus.QUEUED.value), 0, 0, "WITHSCORES")
        replies = await pipe.execute()
    n = 2 * len(upstreams)
    shares = [
        figures(upstream, cast(dict[str, str], state), int(live), now_ms, lost_ms)
        for upstream, state, live in zip(upstreams, replies[:n:2], replies[1:n:2], strict=True)
    ]
    first, read = shares[0], replies[n:]
    per = 3 + len(fair.PRIORITIES)
    counts = [read[i : i + per] for i in range(0, len(read), per)]
    ahead = sum(int(c[0]) for c in counts)
    by_priority = tuple(sum(int(c[1 + i]) for c in counts) for i in range(len(fair.PRIORITIES)))
    oldest = min((score for c in counts for _, score in scored(c[-1])), default=None)
    loads = fair.top_keys(entry for c in counts for entry in key_counts(cast(dict[str, str], c[-2])))
    return LineState(
        limit=first.limit,
        learnt=first.learnt,
        live=first.live,
        waiting=ahead + sum(by_priority),
        oldest_wait_ms=None if oldest is None else max(0, now_ms - int(oldest)),
        refusing=first.refusing,
        detail=first.detail,
        since_ms=first.since_ms,
        retry_at_ms=first.retry_at_ms,
        probes=first.probes,
        refused=first.refused,
        by_priority=by_priority,
        ahead=ahead,
        keys=tuple(loads),
        upstreams=tuple(shares),
    )


async def read_virtual(redis: Redis) -> list[int]:
    """The virtual time of each priority (SPEC S4.2) as the admission state keeps it."""
    values = await redis.hmget(keys.ADMISSION_STATE, [f"v{priority}" for priority in fair.PRIORITIES])
    return [int(float(value or 0)) for value in values]


async def read_needs(
    views: Sequence[JobView], upstreams: Sequence[UpstreamSlots], affinity: Affinity | None, grace_ms: int
) -> list[Need]:
    """What routing needs of each waiting job (SPEC S10), as a pass would see it: the upstream it is bound to
    (a waiting job shows that upstream's hold). One pipeline for the sessions' affinities; nothing is read with one
    upstream."""
    if len(upstreams) < 2:
        return [Need() for _ in views]
    sessions = [view.session_id for view in views if view.attempt == 1 and view.session_id]
    affinities = await affinity.of(sessions) if affinity is not None and sessions else {}
    return [need_of(view, upstreams[0].name, affinities, grace_ms) for view in views]
