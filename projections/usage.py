"""What a job's events say its fairness key used (SPEC S4.5), as a pure function. No IO, no clock.

A run **starts** when Hermes accepts it (`RunAccepted`, each attempt its own run). It **settles** when its slot is
freed: interrupted (`RunInterrupted`; it is resubmitted or the job fails) or with the job's end (`JobFinished`).
Its Hermes time runs from the acceptance to the settling; a run is counted under a status (completed, failed,
cancelled) when the job ends, once per job that had a run; tokens are those Hermes reported for a completed run.
Each fact names the hour it belongs to through its `at_ms`, and carries a marker that is the same however often
the events are read again (a replay, a takeover, a rebuild), so it is counted once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from attrs import frozen

from broker.events import JobEvent, JobFinished, JobStatus, RunAccepted, RunInterrupted
from projections.job import JobView, apply, fold

STATUSES = (JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED)
TOKENS = ("input_tokens", "output_tokens", "total_tokens")


@frozen(kw_only=True)
class Used:
    """One fact of a key's usage: what it adds to the key's hourly bucket."""

    marker: str  #: the same for the same fact, whoever reads it: `<job>:<attempt>:a|i`, `<job>:end`
    key: str  #: the job's fairness key (S4.2)
    at_ms: int  #: when it happened: its hour is its bucket
    runs_started: int = 0
    runs_completed: int = 0
    runs_failed: int = 0
    runs_cancelled: int = 0
    hermes_ms: int = 0  #: the slot time of the run it settles
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0

    @property
    def settles(self) -> bool:
        """The fact of a run's end or interruption: `hermes_ms` is the run's measured slot time and the tokens are
        what Hermes reported for it (what a cost-aware turn charges, SPEC S4.2)."""
        return self.runs_started == 0

    def counts(self) -> tuple[int, ...]:
        """The eight counters, in the order of `FIELDS`."""
        return (
            self.runs_started,
            self.runs_completed,
            self.runs_failed,
            self.runs_cancelled,
            self.hermes_ms,
            self.input_tokens,
            self.output_tokens,
            self.total_tokens,
        )


#: The counters of a bucket, in the order they are stored (`hermes_ms` is answered as `hermes_seconds`).
FIELDS = (
    "runs_started",
    "runs_completed",
    "runs_failed",
    "runs_cancelled",
    "hermes_ms",
    "input_tokens",
    "output_tokens",
    "total_tokens",
)


_COUNTED = (RunAccepted, RunInterrupted, JobFinished)


def facts(view: JobView | None, events: Sequence[JobEvent]) -> list[Used]:
    """What `events`, folded onto `view` (None: from the job's start), add to its key's usage."""
    found: list[Used] = []
    folded = 0  #: the events before this one are folded onto `view` up to here
    for index, event in enumerate(events):
        if not isinstance(event, _COUNTED):
            continue  # most events (relayed Hermes events) count nothing: folded together, at the next that counts
        view = fold(events[folded:index], view)
        if view is not None and not view.status.terminal:
            used = _fact(view, event)
            if used is not None:
                found.append(used)
        view, folded = apply(view, event), index + 1
    return found


def needs_history(view: JobView, events: Iterable[JobEvent]) -> bool:
    """Whether `view` lacks the acceptance time of a run that `events` settle (a view stored before it was kept):
    the caller folds the job's stream instead."""
    live = view.attempts > 0 and view.accepted_attempt == view.attempt and view.live_since_ms is None
    return live and any(isinstance(event, RunInterrupted | JobFinished) for event in events)


def run_ms(view: JobView, at_ms: int) -> int:
    """The Hermes time of the run live in `view` if it settled at `at_ms` (0: none is live)."""
    return max(at_ms - view.live_since_ms, 0) if view.live_since_ms is not None else 0


def _fact(view: JobView, event: JobEvent) -> Used | None:
    key = view.scheduling.fairness_key
    match event:
        case RunAccepted(attempt=attempt, at_ms=at):
            return Used(marker=f"{view.job_id}:{attempt}:a", key=key, at_ms=at, runs_started=1)
        case RunInterrupted(attempt=attempt, at_ms=at) if attempt == view.accepted_attempt:
            if view.live_since_ms is None:
                return None
            return Used(marker=f"{view.job_id}:{attempt}:i", key=key, at_ms=at, hermes_ms=run_ms(view, at))
        case JobFinished(status=status, at_ms=at) if view.attempts > 0 and status in STATUSES:
            tokens = _tokens(event.usage) if status is JobStatus.COMPLETED else (0, 0, 0)
            return Used(
                marker=f"{view.job_id}:end",
                key=key,
                at_ms=at,
                runs_completed=int(status is JobStatus.COMPLETED),
                runs_failed=int(status is JobStatus.FAILED),
                runs_cancelled=int(status is JobStatus.CANCELLED),
                hermes_ms=run_ms(view, at),
                input_tokens=tokens[0],
                output_tokens=tokens[1],
                total_tokens=tokens[2],
            )
        case _:
            return None


def _tokens(usage: str | None) -> tuple[int, int, int]:
    """Hermes's `usage` of a completed run (JSON text): its token counts, 0 for any it lacks or garbles."""
    try:
        document = json.loads(usage) if usage else None
    except ValueError:
        return (0, 0, 0)
    if not isinstance(document, dict):
        return (0, 0, 0)
    values = [document.get(name) for name in TOKENS]
    counts = [value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0 for value in values]
    return (counts[0], counts[1], counts[2])
