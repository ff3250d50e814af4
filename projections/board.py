"""Board versions of SPEC S5 as a pure fold over a job's events. No IO, no clock.

A version is created by a state change (state, runId or error differ) or by real activity that
moves `sourceActivityAt` forward; anything else (silence, deltas, replays, holds, interrupts,
resubmits, late events of a superseded attempt, anything after the terminal fact) creates none.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from enum import StrEnum
from functools import reduce
from typing import assert_never

from attrs import evolve, frozen

from broker.events import (
    ApprovalDenied,
    DeltasDropped,
    HermesEventRecorded,
    JobCreated,
    JobEvent,
    JobFinished,
    JobHeld,
    JobRerouted,
    JobStatus,
    Link,
    Reporting,
    RunAccepted,
    RunInterrupted,
    RunResubmitted,
    StopRequested,
    UnknownEvent,
    thread_key,
)

DENIED_CODE = "approval_denied"
_MAX_SECONDS = 2**53 // 1000  # a later "timestamp" is junk; receivers read JSON numbers as doubles


class EntryState(StrEnum):
    RUNNING = "running"  #: queued, held or executing (receivers show WORKING)
    DONE = "done"  #: completed (receivers show IDLE)
    FAILED = "failed"  #: error = the failure message
    STOPPED = "stopped"  #: cancelled by a stop request or a Hermes-side cancel
    APPROVAL_DENIED = "approval_denied"  #: error = the denied command


@frozen(kw_only=True)
class BoardVersion:
    """One immutable board report of a key, without the configured `platform`."""

    key: str
    session_id: str | None
    state: EntryState
    title: str
    link: str | None
    links: tuple[Link, ...] | None
    error: str | None
    run_id: str | None
    at_ms: int  #: strictly increasing per key
    source_activity_at_ms: int  #: never decreases
    reporting: Reporting
    state_change: bool  #: state, run_id or error differ from the previous version (the first is one)


@frozen(kw_only=True)
class BoardState:
    """What the fold keeps between events: the latest version and the attempt it follows."""

    version: BoardVersion | None = None
    attempt: int = 1  #: the attempt being driven (accepted or not yet)
    hermes_run_id: str | None = None  #: the accepted run of `attempt`; None while it is not accepted
    stop_requested: bool = False
    denied_command: str | None = None

    @property
    def settled(self) -> bool:
        return self.version is not None and self.version.state is not EntryState.RUNNING


def apply(state: BoardState, event: JobEvent) -> BoardState:
    """Fold one event. Nothing exists before JobCreated; a settled entry absorbs everything."""
    if state.version is None:
        return _created(event) if isinstance(event, JobCreated) else state
    if state.settled:
        return state
    return _apply_live(state, event)


def fold(events: Iterable[JobEvent], initial: BoardState | None = None) -> BoardState:
    return reduce(apply, events, BoardState() if initial is None else initial)


def _created(event: JobCreated) -> BoardState:
    key = thread_key(event.job_id)
    context = event.context
    version = BoardVersion(
        key=key,
        session_id=event.session_id,
        state=EntryState.RUNNING,
        title=context.title if context else key,
        link=context.url if context else None,
        links=context.links if context else None,
        error=None,
        run_id=None,
        at_ms=event.at_ms,
        source_activity_at_ms=event.at_ms,  # creation is activity (S5.2)
        reporting=event.reporting,
        state_change=True,
    )
    return BoardState(version=version)


def _apply_live(state: BoardState, event: JobEvent) -> BoardState:
    match event:
        case JobCreated() | UnknownEvent() | DeltasDropped() | JobHeld() | RunInterrupted() | JobRerouted():
            # replays, newer replicas' facts, deltas, and waits that change nothing a receiver sees
            return state
        case RunResubmitted(attempt=attempt):
            if attempt <= state.attempt:
                return state
            # the board keeps the last attempt's runId until Hermes accepts the new one
            return evolve(state, attempt=attempt, hermes_run_id=None)
        case RunAccepted(attempt=attempt, hermes_run_id=run_id, at_ms=at):
            if attempt < state.attempt or (attempt, run_id) == (state.attempt, state.hermes_run_id):
                return state  # superseded or replayed
            state = evolve(state, attempt=attempt, hermes_run_id=run_id)
            return _version(state, at, at, run_id=run_id)
        case HermesEventRecorded():
            if not _is_current(state, event) or event.name == "message.delta":
                return state
            return _version(state, event.at_ms, _source_ms(event))
        case StopRequested(at_ms=at):
            # the first stop is a caller acting on the thread; repeats are replays
            return state if state.stop_requested else _version(evolve(state, stop_requested=True), at, at)
        case ApprovalDenied(attempt=attempt, command=command, at_ms=at):
            if attempt != state.attempt or state.denied_command is not None:
                return state
            return _version(evolve(state, denied_command=command), at, at)
        case JobFinished():
            return _finished(state, event)
        case _:
            assert_never(event)


def _is_current(state: BoardState, event: HermesEventRecorded) -> bool:
    return event.attempt == state.attempt and event.hermes_run_id == state.hermes_run_id


def _finished(state: BoardState, event: JobFinished) -> BoardState:
    match event.status:
        case JobStatus.COMPLETED:
            entry, error = EntryState.DONE, None
        case JobStatus.FAILED:
            entry, error = EntryState.FAILED, event.error_message or event.error_code
        case JobStatus.CANCELLED if _denied(state, event):
            entry, error = EntryState.APPROVAL_DENIED, event.error_message or state.denied_command
        case JobStatus.CANCELLED:
            entry, error = EntryState.STOPPED, None
        case _:
            return state  # a non-terminal "finish" is malformed: it cannot settle the entry
    # a finish learnt later (repair) keeps the known source time; it is never the time of learning
    source = event.at_ms if event.source_at_ms is None else event.source_at_ms
    return _version(state, event.at_ms, source, entry=entry, error=error)


def _denied(state: BoardState, event: JobFinished) -> bool:
    # the job's own error code decides; a recorded denial decides only when the finish names no code
    if event.error_code is not None:
        return event.error_code == DENIED_CODE
    return state.denied_command is not None


def _version(
    state: BoardState,
    at_ms: int,
    source_ms: int,
    *,
    entry: EntryState = EntryState.RUNNING,
    error: str | None = None,
    run_id: str | None = None,
) -> BoardState:
    """The state with a new version, or unchanged when nothing a receiver sees would change.

    `run_id` None keeps the previous one: it names the current or last attempt, never nothing.
    """
    prev = state.version
    assert prev is not None  # only called on a live entry
    run_id = prev.run_id if run_id is None else run_id
    change = (entry, run_id, error) != (prev.state, prev.run_id, prev.error)
    source = max(prev.source_activity_at_ms, source_ms)
    if not change and source == prev.source_activity_at_ms:
        return state
    at = max(at_ms, prev.at_ms + 1)  # strictly increasing and still a function of the events
    version = evolve(
        prev, state=entry, error=error, run_id=run_id, at_ms=at, source_activity_at_ms=source, state_change=change
    )
    return evolve(state, version=version)


def _source_ms(event: HermesEventRecorded) -> int:
    """Hermes's own `timestamp` (float seconds) in ms; the record time only when it has none."""
    try:
        payload = json.loads(event.payload)
    except (ValueError, RecursionError):
        return event.at_ms
    stamp = payload.get("timestamp") if isinstance(payload, dict) else None
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not 0 < stamp < _MAX_SECONDS:
        return event.at_ms  # absent, NaN, negative or absurd: not a source time
    return round(stamp * 1000)
