"""Active-run repair (SPEC S5.6): settle a job whose board shows `running` but that nobody drives any more.

E.g. its driver missed the terminal event. Reconciliation asks Hermes for the run's status (GET only: never
driver input, never activity) and applies decide()'s verdict only if the job's stream position and board
version still match the snapshot taken before the query. An explicit or denied stop wins over the raw status;
an interrupted run eligible for resubmission stays `running` and is handed to the drivers. A finish learnt
this way keeps the board's known source time; where none is known nothing is applied.
"""

from __future__ import annotations

from enum import StrEnum

from attrs import evolve

from broker import tracing
from broker.clock import Clock
from broker.driver import decide
from broker.events import JobEvent, JobFinished, RunResubmitted
from broker.hermes.client import HermesClient
from broker.hermes.fleet import ClientOf
from broker.hermes.models import HermesRun, NotFound
from broker.jobs.policy import Policy
from broker.jobs.writer import Writer
from broker.logging import get_logger
from broker.store.board import BoardStore
from broker.store.jobs import Snapshot
from projections import board as board_projection
from projections import job as job_projection
from projections.board import BoardState, EntryState
from projections.job import JobView


class Repair(StrEnum):
    SKIPPED = "skipped"  #: not active, driven by a replica, not accepted, or no known source time
    UNKNOWN = "unknown"  #: Hermes did not answer usefully: nothing learnt
    LIVE = "live"  #: the run goes on; the job was rung so a driver follows it
    CHANGED = "changed"  #: the job moved on meanwhile: nothing applied
    SETTLED = "settled"  #: the job finished from Hermes's status
    RESUBMITTED = "resubmitted"  #: the run was lost; the job stays running and was rung for its next attempt


class Repairer:
    def __init__(
        self,
        writer: Writer,
        store: BoardStore,
        hermes: HermesClient,
        clock: Clock,
        policy: Policy,
        client_of: ClientOf | None = None,
    ) -> None:
        self._writer = writer
        self._store = store
        self._client_of: ClientOf = client_of or (lambda _: hermes)  #: the run's upstream's client (SPEC S10)
        self._clock = clock
        self._policy = policy
        self._log = get_logger(type(self))

    async def repair(self, job_id: str) -> Repair:
        snapshot = await self._writer.store.load(job_id)
        if snapshot is None:
            return Repair.SKIPPED  # the job's driver state is gone; its board entry is kept as it is
        board = await self._board(job_id, snapshot)
        view = snapshot.view
        version = board.version
        if version is None or version.state is not EntryState.RUNNING or view.status.terminal:
            return Repair.SKIPPED
        run_id = view.hermes_run_id
        if run_id is None or view.accepted_attempt != view.attempt or await self._store.owned(job_id):
            return Repair.SKIPPED
        parent = await self._writer.store.traceparent(job_id) if tracing.enabled() else None
        with tracing.within(parent, {tracing.JOB: job_id}):  # the poll is a span of the job's trace (SPEC S6.1)
            run = await self._client_of(view.upstream).get(run_id)
        if not isinstance(run, HermesRun | NotFound):
            return Repair.UNKNOWN
        events = self._facts(view, run, version.source_activity_at_ms)
        if not events:
            await self._store.ring_driver(job_id, self._clock.now_ms())
            return Repair.LIVE
        return await self._apply(job_id, snapshot, version.at_ms, events)

    def _facts(self, view: JobView, run: HermesRun | NotFound, source_ms: int) -> list[JobEvent]:
        """decide()'s verdict on the status; a finish carries the known source time, never the time of learning."""
        verdict = decide.on_status(view, view.attempt, run, self._clock.now_ms(), self._policy)
        return [evolve(e, source_at_ms=source_ms) if isinstance(e, JobFinished) else e for e in verdict]

    async def _apply(self, job_id: str, snapshot: Snapshot, board_at: int, events: list[JobEvent]) -> Repair:
        entry = await self._store.load(job_id)
        if entry is None or entry.latest_at != board_at:
            return Repair.CHANGED  # a newer board version than the snapshot's
        # expected-last-id append, no retry: after any concurrent write the snapshot is stale and nothing applies
        after = await self._writer.commit(
            job_id, snapshot, lambda v: events if v is snapshot.view else [], log=self._log, retry=False
        )
        if after.view != job_projection.fold(events, snapshot.view):
            return Repair.CHANGED  # the append conflicted; commit handed back the job as another writer left it
        resubmitted = any(isinstance(event, RunResubmitted) for event in events)
        if resubmitted:
            await self._store.ring_driver(job_id, self._clock.now_ms())
        outcome = Repair.RESUBMITTED if resubmitted else Repair.SETTLED
        fields = {"job": job_id, "hermesRun": snapshot.view.hermes_run_id, "status": after.view.status.value}
        self._log.info("Repaired a job from its Hermes run.", extra={**fields, "repair": outcome.value})
        return outcome

    async def _board(self, job_id: str, snapshot: Snapshot) -> BoardState:
        if snapshot.board is not None:
            return snapshot.board
        # written while boards were off, or unreadable here: fold the stream up to the snapshot
        history = await self._writer.store.read(job_id)
        return board_projection.fold(event for entry_id, event in history if _not_after(entry_id, snapshot.last_id))


def _not_after(entry_id: str, last_id: str) -> bool:
    def parts(stream_id: str) -> tuple[int, int]:
        ms, _, seq = stream_id.partition("-")
        return int(ms), int(seq or 0)

    return parts(entry_id) <= parts(last_id)
