"""The board fold (SPEC S5.1/S5.2): versions, activity, staleness and terminal mapping."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from broker.codec import decode, encode
from broker.events import (
    ApprovalDenied,
    Context,
    DeltasDropped,
    HermesEventRecorded,
    HoldReason,
    JobCreated,
    JobEvent,
    JobHeld,
    JobStatus,
    Link,
    Reporting,
    RunAccepted,
    RunInterrupted,
    RunResubmitted,
    StopRequested,
    UnknownEvent,
)
from projections.board import BoardState, BoardVersion, EntryState, apply, fold
from tests.strategies_board import (
    BASE_MS,
    JOB_ID,
    arbitrary_events,
    created,
    finished,
    hermes_event,
    histories,
    run_id_of,
)

KEY = f"runs-{JOB_ID}"


def versions(events: list[JobEvent]) -> list[BoardVersion]:
    """Every version the fold persists, in order: one per event that replaced the latest."""
    state, found = BoardState(), list[BoardVersion]()
    for event in events:
        state = apply(state, event)
        if state.version is not None and (not found or state.version is not found[-1]):
            found.append(state.version)
    return found


def accepted(attempt: int = 1, at_ms: int = BASE_MS + 100) -> RunAccepted:
    return RunAccepted(job_id=JOB_ID, at_ms=at_ms, attempt=attempt, hermes_run_id=run_id_of(attempt))


def latest(events: list[JobEvent]) -> BoardVersion:
    version = fold(events).version
    assert version is not None
    return version


# -- properties over plausible histories and over junk ------------------------------------------


@given(histories())
def test_at_strictly_increases(events: list[JobEvent]) -> None:
    ats = [v.at_ms for v in versions(events)]
    assert ats == sorted(set(ats))


@given(st.lists(arbitrary_events(), max_size=30))
def test_at_strictly_increases_over_junk(events: list[JobEvent]) -> None:
    ats = [v.at_ms for v in versions(events)]
    assert ats == sorted(set(ats))


@given(histories())
def test_fold_is_deterministic(events: list[JobEvent]) -> None:
    assert fold(events) == fold(list(events))


@given(histories(), st.data())
def test_fold_is_resumable(events: list[JobEvent], data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(events)))
    assert fold(events[cut:], fold(events[:cut])) == fold(events)


@given(histories())
def test_rebuild_from_the_stored_stream_gives_the_same_versions(events: list[JobEvent]) -> None:
    rebuilt = [decode(encode(event)) for event in events]
    assert versions(rebuilt) == versions(events)


@given(histories())
def test_first_version_is_the_created_state_change(events: list[JobEvent]) -> None:
    first = versions(events)[0]
    assert first.state_change
    assert (first.state, first.run_id, first.error) == (EntryState.RUNNING, None, None)
    assert first.at_ms == first.source_activity_at_ms == BASE_MS


@given(histories())
def test_state_change_flag_and_no_empty_versions(events: list[JobEvent]) -> None:
    found = versions(events)
    for prev, version in pairwise(found):
        changed = (version.state, version.run_id, version.error) != (prev.state, prev.run_id, prev.error)
        assert version.state_change == changed
        # a version without a state change exists only because activity moved forward
        assert changed or version.source_activity_at_ms > prev.source_activity_at_ms


@given(histories())
def test_source_activity_never_decreases_and_never_comes_from_a_delta(events: list[JobEvent]) -> None:
    state = BoardState()
    for event in events:
        before, state = state, apply(state, event)
        if before.version is None or state.version is before.version:
            continue
        assert state.version is not None
        assert state.version.source_activity_at_ms >= before.version.source_activity_at_ms
        assert not (isinstance(event, HermesEventRecorded) and event.name == "message.delta")


@given(histories())
def test_reporting_and_attribution_are_kept_in_every_version(events: list[JobEvent]) -> None:
    create = events[0]
    context = create.context  # type: ignore[union-attr]
    for version in versions(events):
        assert version.reporting == create.reporting  # type: ignore[union-attr]
        assert version.key == KEY
        assert version.session_id == create.session_id  # type: ignore[union-attr]
        assert version.title == (context.title if context else KEY)
        assert version.link == (context.url if context else None)
        assert version.links == (context.links if context else None)


@given(histories(finish=False), st.lists(st.sampled_from(["delta", "dropped"]), max_size=10))
def test_a_delta_only_suffix_creates_no_version(events: list[JobEvent], suffix: list[str]) -> None:
    state = fold(events)
    run = (state.attempt, state.hermes_run_id or run_id_of(state.attempt))
    more: list[JobEvent] = [
        hermes_event(*run, "message.delta", BASE_MS + 10**6 + i, (BASE_MS + 10**6 + i) / 1000)
        if kind == "delta"
        else DeltasDropped(job_id=JOB_ID, at_ms=BASE_MS + 10**6, attempt=state.attempt, count=3)
        for i, kind in enumerate(suffix)
    ]
    assert fold(more, state) == state


@given(histories(finish=False), st.lists(st.sampled_from(["tool.started", "message.delta", "approval.request"])))
def test_late_events_of_a_superseded_attempt_change_nothing(events: list[JobEvent], names: list[str]) -> None:
    state = fold(events)
    stale: list[JobEvent] = [
        hermes_event(state.attempt - 1, run_id_of(state.attempt - 1), n, BASE_MS + 10**6, None) for n in names
    ]
    stale += [accepted(state.attempt - 1, BASE_MS + 10**6)] if state.attempt > 1 else []
    stale += [ApprovalDenied(job_id=JOB_ID, at_ms=BASE_MS + 10**6, attempt=state.attempt - 1, command="rm")]
    assert fold(stale, state) == state


@given(histories(finish=True), st.lists(arbitrary_events(BASE_MS + 10**6), max_size=20))
def test_nothing_changes_a_settled_entry(events: list[JobEvent], late: list[JobEvent]) -> None:
    state = fold(events)
    assert state.version is not None and state.version.state is not EntryState.RUNNING
    assert fold(late, state) == state


@given(st.lists(arbitrary_events(), max_size=10))
def test_nothing_exists_before_job_created(events: list[JobEvent]) -> None:
    before = [e for e in events if not isinstance(e, JobCreated)]
    assert fold(before) == BoardState()


# -- examples ---------------------------------------------------------------------------------


def test_terminal_mapping() -> None:
    base: list[JobEvent] = [created(), accepted()]
    cases = [
        (finished(BASE_MS + 9, JobStatus.COMPLETED), EntryState.DONE, None),
        (finished(BASE_MS + 9, JobStatus.FAILED, "hermes_failed", "boom"), EntryState.FAILED, "boom"),
        (finished(BASE_MS + 9, JobStatus.CANCELLED, "stopped", "stopped"), EntryState.STOPPED, None),
        (
            finished(BASE_MS + 9, JobStatus.CANCELLED, "approval_denied", "rm -rf /"),
            EntryState.APPROVAL_DENIED,
            "rm -rf /",
        ),
    ]
    for event, state, error in cases:
        version = latest([*base, event])
        assert (version.state, version.error, version.run_id) == (state, error, run_id_of(1))
        assert version.state_change and version.at_ms == BASE_MS + 101  # clamped past the accept


def test_a_recorded_denial_decides_when_the_finish_names_no_code() -> None:
    denied = ApprovalDenied(job_id=JOB_ID, at_ms=BASE_MS + 200, attempt=1, command="rm -rf /")
    version = latest([created(), accepted(), denied, finished(BASE_MS + 300, JobStatus.CANCELLED)])
    assert (version.state, version.error) == (EntryState.APPROVAL_DENIED, "rm -rf /")
    stopped = latest([created(), accepted(), denied, finished(BASE_MS + 300, JobStatus.CANCELLED, "stopped")])
    assert (stopped.state, stopped.error) == (EntryState.STOPPED, None)


def test_a_job_finished_before_acceptance_has_no_run_id() -> None:
    held = JobHeld(job_id=JOB_ID, at_ms=BASE_MS + 5, reason=HoldReason.BUSY, retry_at_ms=BASE_MS + 1000)
    found = versions([created(), held, finished(BASE_MS + 9, JobStatus.FAILED, "hold_expired", "expired")])
    assert [(v.state, v.run_id, v.error) for v in found] == [
        (EntryState.RUNNING, None, None),
        (EntryState.FAILED, None, "expired"),
    ]


def test_hermes_time_is_the_source_time_and_record_time_orders() -> None:
    tool = hermes_event(1, run_id_of(1), "tool.started", BASE_MS + 900, (BASE_MS + 400) / 1000)
    version = latest([created(), accepted(), tool])
    assert (version.at_ms, version.source_activity_at_ms, version.state_change) == (BASE_MS + 900, BASE_MS + 400, False)
    untimed = hermes_event(1, run_id_of(1), "reasoning.available", BASE_MS + 950, None)
    assert latest([created(), accepted(), tool, untimed]).source_activity_at_ms == BASE_MS + 950


def test_resubmit_keeps_the_last_run_id_until_the_next_accept() -> None:
    interrupted = RunInterrupted(job_id=JOB_ID, at_ms=BASE_MS + 200, attempt=1, hermes_run_id=None, reason="x")
    resubmitted = RunResubmitted(job_id=JOB_ID, at_ms=BASE_MS + 201, attempt=2)
    found = versions(
        [created(), accepted(), interrupted, resubmitted, StopRequested(job_id=JOB_ID, at_ms=BASE_MS + 300)]
    )
    assert [(v.run_id, v.state_change, v.source_activity_at_ms) for v in found] == [
        (None, True, BASE_MS),
        (run_id_of(1), True, BASE_MS + 100),
        (run_id_of(1), False, BASE_MS + 300),  # the stop is a caller acting; interrupt/resubmit are not
    ]
    assert latest([created(), accepted(), interrupted, resubmitted, accepted(2, BASE_MS + 400)]).run_id == run_id_of(2)


def test_holds_replays_and_unknown_events_create_no_version() -> None:
    held = JobHeld(job_id=JOB_ID, at_ms=BASE_MS + 5, reason=HoldReason.DRAINING, retry_at_ms=BASE_MS + 1000)
    stop = StopRequested(job_id=JOB_ID, at_ms=BASE_MS + 300)
    events: list[JobEvent] = [created(), held, held, UnknownEvent(), created(), accepted(), accepted(), stop, stop]
    assert len(versions(events)) == 3


def test_context_and_flags_render_into_every_version() -> None:
    context = Context(title="Review staging", url="https://x.example/mr/1", links=[Link("MR", "https://x.example")])
    create = created(context=context, session_id="s-1", reporting=Reporting(board=False, post=False))
    for version in versions([create, accepted(), finished(BASE_MS + 500, JobStatus.COMPLETED)]):
        assert (version.title, version.link, version.links) == (context.title, context.url, context.links)
        assert (version.session_id, version.reporting) == ("s-1", Reporting(board=False, post=False))
