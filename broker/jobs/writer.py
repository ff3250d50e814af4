"""The one way a job changes: fold the events into the job view and the board, append it all in one script.

read -> decide -> append; after a concurrent append (another replica, a stop) re-read and decide again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from broker.admission.quotas import Bound
from broker.board.projector import BoardSettings, board_write
from broker.callbacks.outbox import CallbackSettings, owed
from broker.clock import Clock
from broker.errors import Busy, JobNotFound, StreamConflict
from broker.events import JobCreated, JobEvent
from broker.jobs import journal
from broker.metrics import Metrics
from broker.store import usage as usage_store
from broker.store.bound import Counted
from broker.store.callbacks import CallbackWrite
from broker.store.jobs import BoardWrite, Created, JobStore, Snapshot
from projections import board as board_projection
from projections import usage
from projections.job import JobView, apply, fold

MAX_CONFLICTS = 50

Facts = Callable[[JobView], list[JobEvent]]


class Writer:
    def __init__(
        self,
        store: JobStore,
        clock: Clock,
        metrics: Metrics,
        board: BoardSettings | None,
        callbacks: CallbackSettings | None = None,
    ) -> None:
        """`callbacks`: None writes no callback deliveries (a job created with one keeps its URL, SPEC S5.8)."""
        self.store = store
        self._clock = clock
        self._metrics = metrics
        self._board = board
        self._callbacks = callbacks

    async def create(self, event: JobCreated, bound: Bound | None = None, held: Counted = (0, 0)) -> Created:
        """Store a new job (`bound`: the waiting bounds it must be under, SPEC S4.4, with `held` jobs of its key and
        in all waiting out of the line), or find the existing one."""
        view = apply(None, event)
        assert view is not None  # JobCreated always creates
        board = await self._board_write(event.job_id, None, [event])
        return await self.store.create(event, view, board, bound, held)

    async def commit(
        self,
        job_id: str,
        snapshot: Snapshot,
        facts: Facts,
        *,
        log: logging.Logger,
        lease_token: str | None = None,
        retry: bool = True,
        released: Callable[[], None] | None = None,
    ) -> Snapshot:
        """Append what `facts` derives from the job; `retry=False` returns the fresh job after a conflict.

        `released` (with `lease_token`): a write that ends the job releases its run lease too, and then calls it."""
        for _ in range(MAX_CONFLICTS):
            events = facts(snapshot.view)
            if not events:
                return snapshot
            view = fold(events, snapshot.view)
            assert view is not None
            board = await self._board_write(job_id, snapshot, events)
            try:
                ids = await self.store.append(
                    job_id,
                    events,
                    view,
                    expected_last_id=snapshot.last_id,
                    lease_token=lease_token,
                    board=board,
                    before=snapshot.view,
                    release=released is not None,
                    callback=(callback := self._callback_write(snapshot.view, events)),
                    usage=await self._usage(job_id, snapshot.view, events),
                )
            except StreamConflict:
                log.debug("Retried an append after a concurrent write.", extra={"job": job_id})
                snapshot = await self.load(job_id)
                if not retry:
                    return snapshot
                continue
            if released is not None and lease_token and view.status.terminal and not snapshot.view.status.terminal:
                released()
            if callback is not None and self._callbacks is not None:
                self._callbacks.owed()
            journal.record(log, self._metrics, view, events)
            return Snapshot(view, ids[-1], board.state if board else snapshot.board)
        raise Busy(f"Job {job_id} is changing too fast; try again")

    def _callback_write(self, before: JobView, events: Sequence[JobEvent]) -> CallbackWrite | None:
        """The callback deliveries the events owe (SPEC S5.8); None for a job without a callback."""
        settings = self._callbacks
        if settings is None or before.callback_url is None:
            return None
        deliveries = owed(before, events, settings.render)
        if not deliveries:
            return None
        return CallbackWrite(
            url=before.callback_url,
            add=tuple((delivery.webhook_id, delivery.body) for delivery in deliveries),
            now_ms=self._clock.now_ms(),
            ttl_ms=settings.ttl_ms,
        )

    async def _usage(self, job_id: str, before: JobView, events: Sequence[JobEvent]) -> list[tuple[int, bytes]]:
        """What the events add to their key's usage (SPEC S4.5), written with them. A view stored before it kept its
        run's acceptance time is refolded from the stream (once, when that run settles)."""
        if usage.needs_history(before, events):
            refolded = fold(event for _, event in await self.store.read(job_id))
            before = refolded or before
        return [(used.at_ms, usage_store.encode(used)) for used in usage.facts(before, events)]

    async def load(self, job_id: str) -> Snapshot:
        snapshot = await self.store.load(job_id)
        if snapshot is None:
            raise JobNotFound(job_id)
        return snapshot

    async def _board_write(
        self, job_id: str, snapshot: Snapshot | None, events: Sequence[JobEvent]
    ) -> BoardWrite | None:
        if self._board is None:
            return None
        before = snapshot.board if snapshot else None
        if snapshot is not None and before is None:
            # No stored board state (written while boards were off, or unreadable): fold the history.
            history = await self.store.read(job_id)
            before = board_projection.fold(event for _, event in history)
        return board_write(before, events, self._board, self._clock.now_ms())
