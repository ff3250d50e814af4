"""Hypothesis strategies for plausible job histories, as the board fold sees them.

A history starts with JobCreated, then walks a small driver: holds, accepts with increasing
attempts, Hermes events of the current and of superseded attempts, interrupts and resubmits,
stops, denials, and at most one JobFinished followed by arbitrary junk. Event clocks come from
several replicas, so `at_ms` mostly grows but may step back a little.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from broker.events import (
    ApprovalDenied,
    Context,
    DeltasDropped,
    HermesEventRecorded,
    HoldReason,
    JobCreated,
    JobEvent,
    JobFinished,
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

JOB_ID = "job_" + "ab" * 16
BASE_MS = 1_796_005_747_391
HERMES_NAMES = (
    "message.delta",
    "tool.started",
    "tool.completed",
    "reasoning.available",
    "approval.request",
    "approval.responded",
    "todo.updated",
    "subagent.started",
)

texts = st.text(min_size=1, max_size=12)
urls = st.builds(lambda host: f"https://{host}.example/x", st.from_regex(r"[a-z]{1,8}", fullmatch=True))
links = st.builds(Link, text=texts, url=urls)
contexts = st.builds(Context, title=texts, url=st.none() | urls, links=st.none() | st.lists(links, max_size=3))
reportings = st.builds(Reporting, board=st.booleans(), post=st.booleans())


def created(at_ms: int = BASE_MS, **overrides: object) -> JobCreated:
    fields: dict[str, object] = {"job_id": JOB_ID, "at_ms": at_ms, "body": '{"input":"hi"}', "fingerprint": "f" * 64}
    fields.update(overrides)
    return JobCreated(**fields)  # type: ignore[arg-type]


def hermes_payload(name: str, run_id: str, stamp: object) -> str:
    payload: dict[str, object] = {"event": name, "run_id": run_id}
    if stamp is not None:
        payload["timestamp"] = stamp
    return json.dumps(payload)


def hermes_event(attempt: int, run_id: str, name: str, at_ms: int, stamp: object = None) -> HermesEventRecorded:
    payload = hermes_payload(name, run_id, stamp)
    return HermesEventRecorded(
        job_id=JOB_ID, at_ms=at_ms, attempt=attempt, hermes_run_id=run_id, name=name, payload=payload
    )


def run_id_of(attempt: int) -> str:
    return f"run_{attempt:032x}"


# a Hermes `timestamp` near the record time, absent, or junk the fold must not trust
def stamps(at_ms: int) -> st.SearchStrategy[object]:
    near = st.integers(at_ms - 5_000, at_ms + 50).map(lambda ms: ms / 1000)
    junk = st.sampled_from(["x", True, -1.0, float("nan"), float("inf"), 10**30, [1]])
    return st.one_of(near, near, st.none(), junk)


@st.composite
def arbitrary_events(draw: st.DrawFn, at_ms: int = BASE_MS) -> JobEvent:
    """Any single event, valid or not for where it lands: junk for late and replayed positions."""
    at = st.integers(at_ms - 10_000, at_ms + 10_000)
    attempt = st.integers(0, 6)
    run = attempt.map(run_id_of)
    kind = draw(st.integers(0, 10))
    strategies: list[st.SearchStrategy[JobEvent]] = [
        st.builds(created, at_ms=at, reporting=reportings, context=st.none() | contexts),
        st.builds(JobHeld, job_id=st.just(JOB_ID), at_ms=at, reason=st.sampled_from(HoldReason), retry_at_ms=at),
        st.builds(RunAccepted, job_id=st.just(JOB_ID), at_ms=at, attempt=attempt, hermes_run_id=run),
        st.builds(hermes_event, attempt, run, st.sampled_from(HERMES_NAMES), at, at.map(lambda ms: ms / 1000)),
        st.builds(DeltasDropped, job_id=st.just(JOB_ID), at_ms=at, attempt=attempt, count=st.integers(1, 9)),
        st.builds(RunInterrupted, job_id=st.just(JOB_ID), at_ms=at, attempt=attempt, hermes_run_id=run, reason=texts),
        st.builds(RunResubmitted, job_id=st.just(JOB_ID), at_ms=at, attempt=attempt),
        st.builds(StopRequested, job_id=st.just(JOB_ID), at_ms=at),
        st.builds(ApprovalDenied, job_id=st.just(JOB_ID), at_ms=at, attempt=attempt, command=texts),
        st.builds(finished, at, st.sampled_from(JobStatus), st.none() | texts, st.none() | texts),
        st.just(UnknownEvent()),
    ]
    return draw(strategies[kind])


def finished(at_ms: int, status: JobStatus, code: str | None = None, message: str | None = None) -> JobFinished:
    return JobFinished(job_id=JOB_ID, at_ms=at_ms, status=status, error_code=code, error_message=message)


terminals = st.sampled_from(
    [
        (JobStatus.COMPLETED, None, None),
        (JobStatus.FAILED, "hermes_failed", "HTTP 400: stub forced 400"),
        (JobStatus.FAILED, "hold_expired", "Hermes did not accept the job in time."),
        (JobStatus.CANCELLED, "stopped", "stopped"),
        (JobStatus.CANCELLED, "approval_denied", "rm -rf <scratch-dir>"),
        (JobStatus.CANCELLED, None, None),
    ]
)


@st.composite
def histories(draw: st.DrawFn, *, finish: bool | None = None) -> list[JobEvent]:
    """A plausible job stream. `finish` forces (True) or forbids (False) the terminal fact."""
    context = draw(st.none() | contexts)
    session_id = draw(st.none() | texts)
    events: list[JobEvent] = [created(BASE_MS, context=context, session_id=session_id, reporting=draw(reportings))]
    clock, attempt, accepted = BASE_MS, 1, False
    for _ in range(draw(st.integers(0, 25))):
        clock += draw(st.integers(-200, 3_000))  # replicas' clocks disagree a little
        step = draw(st.sampled_from(["hold", "accept", "hermes", "hermes", "stale", "interrupt", "stop", "deny", "x"]))
        if step == "hold" and not accepted:
            events.append(JobHeld(job_id=JOB_ID, at_ms=clock, reason=HoldReason.BUSY, retry_at_ms=clock + 1000))
        elif step == "accept" and not accepted:
            events.append(RunAccepted(job_id=JOB_ID, at_ms=clock, attempt=attempt, hermes_run_id=run_id_of(attempt)))
            accepted = True
        elif step == "hermes" and accepted:
            name = draw(st.sampled_from(HERMES_NAMES))
            events.append(hermes_event(attempt, run_id_of(attempt), name, clock, draw(stamps(clock))))
        elif step == "stale" and attempt > 1:
            old = draw(st.integers(1, attempt - 1))
            events.append(hermes_event(old, run_id_of(old), draw(st.sampled_from(HERMES_NAMES)), clock, clock / 1000))
        elif step == "interrupt" and accepted:
            events.append(RunInterrupted(job_id=JOB_ID, at_ms=clock, attempt=attempt, hermes_run_id=None, reason="x"))
            attempt, accepted = attempt + 1, False
            events.append(RunResubmitted(job_id=JOB_ID, at_ms=clock + 1, attempt=attempt))
        elif step == "stop":
            events.append(StopRequested(job_id=JOB_ID, at_ms=clock))
        elif step == "deny" and accepted:
            events.append(ApprovalDenied(job_id=JOB_ID, at_ms=clock, attempt=attempt, command="rm -rf /"))
        elif step == "x":
            events.append(draw(st.sampled_from([UnknownEvent(), events[0]])))
    if finish if finish is not None else draw(st.booleans()):
        status, code, message = draw(terminals)
        events.append(finished(clock + draw(st.integers(-200, 3_000)), status, code, message))
        events.extend(draw(st.lists(arbitrary_events(clock), max_size=8)))
    return events
