"""Pure arithmetic of the `upstreams` row's checks: the simulators' request logs and the jobs' own records.

A simulator's request log holds one entry per /v1 request (`method`, `path`, `status`, `idempotency_key`, and
`run_id` when the create started a run). The broker's Idempotency-Key of attempt 1 is the job id, `<job>#<n>`
after (docs/concepts/internals.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

Request = Mapping[str, object]


def job_of(key: str) -> str:
    """The job an attempt's Idempotency-Key belongs to."""
    return key.split("#", 1)[0]


def started_runs(log: Iterable[Request]) -> list[tuple[str, str]]:
    """(Idempotency-Key, simulator run id) of every create that started a run (202 with a run id)."""
    found = []
    for entry in log:
        if entry.get("method") == "POST" and entry.get("path") == "/v1/runs" and entry.get("status") == 202:
            key, run_id = entry.get("idempotency_key"), entry.get("run_id")
            if isinstance(key, str) and isinstance(run_id, str):
                found.append((key, run_id))
    return found


def runs_per_key(logs: Iterable[Iterable[Request]]) -> Counter[str]:
    """How many runs each Idempotency-Key started, across every simulator's log."""
    return Counter(key for log in logs for key, _ in started_runs(log))


def ran_twice(logs: Iterable[Iterable[Request]]) -> dict[str, int]:
    """The Idempotency-Keys that started more than one run (none, if no attempt ever ran twice)."""
    return {key: runs for key, runs in runs_per_key(logs).items() if runs > 1}


def on_own_upstream(upstreams_of: Mapping[str, Sequence[str | None]]) -> int:
    """Turns on their session's upstream: per session, the turns on the upstream most of its turns ran on (all of
    them when the session never moved); a turn with no upstream (None) counts as off it."""
    total = 0
    for turns in upstreams_of.values():
        named = Counter(upstream for upstream in turns if upstream is not None)
        total += max(named.values(), default=0)
    return total


def spread(upstream_of_session: Mapping[str, str], names: Sequence[str]) -> str:
    """Sessions per upstream in `names` order, e.g. "12/17/21"."""
    per = Counter(upstream_of_session.values())
    return "/".join(str(per.get(name, 0)) for name in names)


def accepted_per_attempt(events: Iterable[Mapping[str, object]]) -> Counter[int]:
    """A job's `job.accepted` events by attempt (each attempt at most once when no attempt ran twice)."""
    return Counter(int(str(event.get("attempt"))) for event in events if event.get("event") == "job.accepted")
