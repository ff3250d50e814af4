"""Pure arithmetic of the `conversations` row (SPEC S4.3): a job's times from its events and its object, and a
session's turns' overlaps, order and handovers.

A job runs from its first `job.accepted` (Hermes answered its create) to its terminal event; both carry the
broker's `timestamp` in epoch seconds, as the job object's `created_at` does. A session's jobs come in create order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import combinations, pairwise
from typing import NamedTuple

ENDS = frozenset({"run.completed", "run.failed", "run.cancelled"})


class Job(NamedTuple):
    created: float
    start: float
    end: float


class Handover(NamedTuple):
    """One turn's end to the next turn's start."""

    gap: float  #: s; negative: the two overlapped
    late: float  #: s from when the next turn was due (`due`) to its start
    overtaken: bool  #: a job created after the next turn started more than the grace after it was due, before it


def job_times(created: float, events: Iterable[Mapping[str, object]]) -> Job:
    """A job's times from its `created_at` and its events; raises when its `job.accepted` or its end is missing."""
    start = end = None
    for event in events:
        name = event.get("event")
        if name == "job.accepted" and start is None:
            start = float(str(event["timestamp"]))
        elif name in ENDS:
            end = float(str(event["timestamp"]))
    if start is None or end is None:
        raise ValueError(f"a job's events lack its {'job.accepted' if start is None else 'terminal event'}")
    return Job(created, start, end)


def overlaps(turns: Sequence[Job]) -> int:
    """Pairs of turns whose [start, end] intervals overlap; a turn starting the moment another ended does not."""
    return sum(max(a.start, b.start) < min(a.end, b.end) for a, b in combinations(turns, 2))


def out_of_order(turns: Sequence[Job]) -> bool:
    """Whether the turns (in create order) started in another order."""
    return any(later.start < earlier.start for earlier, later in pairwise(turns))


def due(job: Job, others: Iterable[Job], free_at: float) -> float:
    """When `job` was due to start in a first-come line: once it existed, its session was free (`free_at`) and
    every job of `others` created before it that started before it had started (those had their places ahead)."""
    ahead = (other.start for other in others if other.created < job.created and other.start < job.start)
    return max(job.created, free_at, *ahead)


def lateness(jobs: Iterable[Job], others: Sequence[Job]) -> list[float]:
    """Seconds from when each job was due to its start (for jobs without a session: free when created)."""
    return [job.start - due(job, others, job.created) for job in jobs]


def handovers(turns: Sequence[Job], others: Sequence[Job], grace_s: float) -> list[Handover]:
    """Each of a session's handovers; `others` holds the jobs that shared the line (the session's own may be there:
    none of them starts between two of its turns)."""
    found = []
    for earlier, later in pairwise(turns):
        when = due(later, others, earlier.end)
        overtaken = any(
            other.created > later.created and when + grace_s < other.start < later.start for other in others
        )
        found.append(Handover(later.start - earlier.end, later.start - when, overtaken))
    return found
