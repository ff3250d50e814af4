"""What the admission state and the lines say to observers (SPEC S3.8 `/readyz`, S4.1, S4.2, S10): the
figures of each upstream, the waiting jobs by priority, the keys with most waiting jobs, the oldest queued
job, and the virtual time a create needs. Reads only; the pass that writes is broker/store/admission.py."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import cast

from attrs import frozen
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from broker.admission import fair
from broker.admission.route import Need
from broker.admission.state import LineState
from broker.admission.top_keys import LISTED, Listed, candidates, merged, to_look_up
from broker.events import JobStatus
from broker.store import keys
from broker.store.affinity import Affinity
from broker.store.replies import ints_and_ids
from broker.store.upstream_admission import UpstreamSlots, figures, need_of
from projections.job import JobView


async def read_line_state(
    redis: Redis,
    upstreams: Sequence[UpstreamSlots],
    now_ms: int,
    lost_ms: int,
    *,
    lines: bool = True,
    figures_script: AsyncScript | None = None,
) -> LineState:
    """The shared figures; without `lines` the 64 lines are not read (`waiting` 0, `oldest_wait_ms`
    None): what a waiting job's hold needs is the limit, the live runs and the refusal. With them (and
    `figures_script`, line_figures.lua): the waiting jobs per priority band, the jobs in the due schedules, the
    fairness keys with most waiting jobs, and the oldest queued job's age (the listing's queued index: a line's
    score is no time any more, SPEC S4.2). One pipeline of 2 calls per upstream and one script per partition,
    and a second of at most one HMGET per partition when the keys' counts need it: the same calls whatever the
    number of waiting jobs and keys (SPEC S4.2)."""
    read = figures_script if lines else None
    replies = await _first_read(redis, upstreams, now_ms, read)
    n = 2 * len(upstreams)
    shares = [
        figures(upstream, cast(dict[str, str], state), int(cast(int, live)), now_ms, lost_ms)
        for upstream, state, live in zip(upstreams, replies[:n:2], replies[1:n:2], strict=True)
    ]
    first = shares[0]
    parts = [_partition(ints_and_ids(reply)) for reply in replies[n:]]
    ahead = sum(part.counts[0] for part in parts)
    by_priority = tuple(sum(part.counts[i] for part in parts) for i in range(1, len(fair.PRIORITIES) + 1))
    oldest = min((part.oldest for part in parts if part.oldest is not None), default=None)
    lists = [part.listed for part in parts]
    loads = await _top_keys(redis, lists) if lists else []
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
        scheduled=sum(part.due for part in parts),
        session_waiting=sum(part.sessions for part in parts),
    )


@frozen
class _Partition:
    """line_figures.lua's reply: the counts of the score ranges (ahead, each band), due jobs, oldest queued."""

    counts: list[int]
    due: int
    oldest: float | None
    listed: Listed
    sessions: int = 0  #: turns waiting for their session (SPEC S4.3)


def _partition(reply: list[str]) -> _Partition:
    ranges = 1 + len(fair.PRIORITIES)
    counts, (due, oldest, sessions, complete), listed = reply[:ranges], reply[ranges : ranges + 4], reply[ranges + 4 :]
    entries = tuple((listed[i], int(listed[i + 1]), float(listed[i + 2] or 1.0)) for i in range(0, len(listed) - 2, 3))
    return _Partition(
        [int(c) for c in counts],
        int(due),
        float(oldest) if oldest else None,
        Listed(entries, complete == "1"),
        max(int(sessions), 0),
    )


async def _first_read(
    redis: Redis, upstreams: Sequence[UpstreamSlots], now_ms: int, script: AsyncScript | None
) -> list[object]:
    """Each upstream's state and live runs, then line_figures.lua per partition, in one pipeline (loaded and read
    again once on NOSCRIPT: a restarted Redis)."""
    for _ in range(2):
        async with redis.pipeline(transaction=False) as pipe:
            for upstream in upstreams:  # one slot each (SPEC S10)
                pipe.hgetall(upstream.keys.state)
                pipe.zcount(upstream.keys.live, f"({now_ms}", "+inf")
            for partition in keys.partitions():
                if script is not None:
                    figure_keys = _figure_keys(partition)
                    pipe.execute_command("EVALSHA", script.sha, len(figure_keys), *figure_keys, *_FIGURE_ARGS)
            replies = cast(list[object], await pipe.execute(raise_on_error=False))
        if script is None or not any(isinstance(reply, NoScriptError) for reply in replies):
            break
        await redis.script_load(script.script)
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies


async def _top_keys(redis: Redis, lists: list[Listed]) -> list[fair.KeyLoad]:
    """The keys with most waiting jobs from the partitions' lists, their counts looked up where a list is not
    complete (broker/admission/top_keys.py): at most one HMGET per partition, of CANDIDATES fields at most."""
    chosen = candidates(lists)
    wanted = to_look_up(lists, chosen)
    looked_up: dict[int, dict[str, int]] = {}
    if wanted:
        async with redis.pipeline(transaction=False) as pipe:
            for partition, names in wanted.items():
                pipe.hmget(keys.fair(partition), [f"n:{name}" for name in names])
            replies = await pipe.execute()
        for (partition, names), counts in zip(wanted.items(), replies, strict=True):
            looked_up[partition] = {name: int(count) for name, count in zip(names, counts, strict=True) if count}
    return merged(lists, chosen, looked_up)


#: line_figures.lua's ARGV: most keys listed, then the score ranges counted: ahead of the bands, each band.
_FIGURE_ARGS: tuple[str, ...] = (
    str(LISTED),
    "-inf",
    f"({fair.BASE}",
    *(
        bound
        for p in fair.PRIORITIES
        for bound in (str(fair.front(p)), f"({fair.front(p + 1)}" if p < fair.PRIORITIES[-1] else "+inf")
    ),
)


@functools.cache
def _figure_keys(partition: int) -> tuple[str, ...]:
    return (
        keys.line(partition),
        keys.fair(partition),
        keys.fair_top(partition),
        keys.runs_index(partition, JobStatus.QUEUED.value),
        keys.due(partition),
        keys.sessions(partition),
        keys.parked(partition),
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
