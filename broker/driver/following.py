"""What a job's runner does with its live Hermes run (the base of `runner.Runner`): relays its event stream, polls
it when the stream is gone or silent, stops it, and counts it interrupted when its upstream is lost (SPEC S3, S10).

Every append is fenced by the run lease and by the stream position it decided on; on a conflict (a stop recorded
meanwhile) it re-reads the job and decides again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

from broker import tracing
from broker.driver import decide
from broker.driver.decide import Follow
from broker.driver.deps import Deps
from broker.driver.pump import Nudge, Pump, release
from broker.events import JobEvent
from broker.hermes.client import HermesClient
from broker.hermes.models import HermesEvent, HermesRun, NotFound
from broker.logging import get_logger
from broker.store.jobs import Snapshot
from projections.job import JobView


class Following:
    """A runner's job and its live run: what the run's stream, polls and stops append to the job."""

    def __init__(self, job_id: str, token: str, deps: Deps, *, admitted: bool, upstream: str | None) -> None:
        self.job_id = job_id
        self.token = token
        self.has_slot = admitted  #: this runner holds the job's admission slot
        #: the upstream whose admission slot it holds (SPEC S10): granted, or its live run's on a takeover
        self.slot_upstream = upstream
        self._deps = deps
        self._wake = Nudge()
        self._pump: Pump | None = None
        self._stop_sent_attempt = 0
        self._failures = 0  #: consecutive calls Hermes did not answer (stop, poll): the backoff exponent
        self._suspect_terminal = False
        self._log = get_logger(type(self))

    def nudge(self) -> None:
        """The job's stream changed outside this runner (a stop, an approval): look now."""
        self._wake.set()

    async def _stop(self, snapshot: Snapshot, run_id: str) -> Snapshot:
        outcome = await self._run_client(snapshot.view).stop(run_id)
        now = self._deps.clock.now_ms()
        answer = decide.on_stop(snapshot.view, outcome, now)
        if answer.retry:
            if await self._deps.gate.store.lost(snapshot.view.upstream, now):
                # its upstream is lost: the run counts as interrupted, and the stop wins (SPEC S10, S3.4)
                return await self._upstream_lost(snapshot, Follow(snapshot.view.attempt, run_id))
            message = "Could not reach Hermes to stop a run; retrying with backoff."
            await self._back_off(message, run_id, outcome, self._run_client(snapshot.view))
            return await self._reload()
        self._failures = 0
        if answer.sent:
            self._stop_sent_attempt = snapshot.view.attempt
            self._log.info("Asked Hermes to stop a run.", extra={"job": self.job_id, "hermesRun": run_id})
        return await self._commit(snapshot, lambda v: list(decide.on_stop(v, outcome, now).events))

    async def _back_off(self, message: str, run_id: str, outcome: object, client: HermesClient) -> None:
        """Wait before asking Hermes again: jittered exponential backoff, one warn line per failure streak; cut short
        when a call to the same server gets an answer (it is back: a restarted Hermes is polled at once)."""
        self._failures += 1
        if self._failures == 1:
            fields = {"job": self.job_id, "hermesRun": run_id, "error": getattr(outcome, "reason", repr(outcome))}
            self._log.warning(message, extra=fields)
        await self._sleep(decide.backoff_ms(self._failures, self._deps.jitter(), self._deps.policy), client.answered())

    async def _follow(self, snapshot: Snapshot, action: Follow) -> Snapshot:
        pump = self._pump
        if pump is None or pump.ended or pump.attempt != action.attempt:
            return await self._poll(snapshot, action)
        try:
            items = await pump.wait(self._deps.poll_interval_ms / 1000, self._wake)
        except asyncio.CancelledError:  # a drain, maybe while events waited for more: they are stored first
            with contextlib.suppress(Exception):
                await self._relay(snapshot, action, pump.take())
            raise
        if self._wake.is_set():
            self._wake.clear()
            snapshot = await self._reload()
        events = pump.events(items)
        if events:
            self._suspect_terminal = False
            snapshot = await self._relay(snapshot, action, events)
        elif not items:
            snapshot = await self._check_silence(snapshot, action)
        return snapshot

    async def _relay(self, snapshot: Snapshot, action: Follow, events: list[HermesEvent]) -> Snapshot:
        if not events:
            return snapshot
        now, policy = self._deps.clock.now_ms(), self._deps.policy
        return await self._commit(
            snapshot, lambda v: decide.on_events(v, action.attempt, action.hermes_run_id, events, now, policy)
        )

    async def _check_silence(self, snapshot: Snapshot, action: Follow) -> Snapshot:
        """No event for a poll interval: make sure the run is still there, and not finished behind a hung stream."""
        snapshot = await self._reload()  # a stop whose nudge was lost is seen here
        if snapshot.view.stop_requested and self._stop_sent_attempt != snapshot.view.attempt:
            return snapshot
        run = await self._run_client(snapshot.view).get(action.hermes_run_id)
        if isinstance(run, HermesRun) and run.terminal and not self._suspect_terminal:
            self._suspect_terminal = True  # give the stream one more interval to deliver the terminal event
            return snapshot
        if isinstance(run, HermesRun | NotFound):
            return await self._settle(snapshot, action, run)
        if await self._deps.gate.store.lost(snapshot.view.upstream, self._deps.clock.now_ms()):
            return await self._upstream_lost(snapshot, action)  # a frozen host: its stream is silent, polls fail
        return snapshot

    async def _poll(self, snapshot: Snapshot, action: Follow) -> Snapshot:
        run = await self._run_client(snapshot.view).get(action.hermes_run_id)
        if isinstance(run, HermesRun | NotFound):
            self._failures = 0
            snapshot = await self._settle(snapshot, action, run)
            if not snapshot.view.status.terminal and snapshot.view.attempt == action.attempt:
                await self._sleep(self._deps.poll_interval_ms)
        elif await self._deps.gate.store.lost(snapshot.view.upstream, self._deps.clock.now_ms()):
            snapshot = await self._upstream_lost(snapshot, action)  # SPEC S10: resubmitted elsewhere
        else:  # Hermes is unreachable: poll again, backing off past the poll interval
            message = "Could not reach Hermes to poll a run; retrying with backoff."
            await self._back_off(message, action.hermes_run_id, run, self._run_client(snapshot.view))
        return await self._reload() if not snapshot.view.status.terminal else snapshot

    async def _settle(self, snapshot: Snapshot, action: Follow, run: HermesRun | NotFound) -> Snapshot:
        now, policy = self._deps.clock.now_ms(), self._deps.policy
        return await self._commit(snapshot, lambda v: decide.on_status(v, action.attempt, run, now, policy))

    async def _upstream_lost(self, snapshot: Snapshot, action: Follow) -> Snapshot:
        """Its upstream has answered nothing for HERMES_UPSTREAM_LOST: the run counts as interrupted, and the
        resubmit goes back to the line without the lost upstream's slot, so it is routed elsewhere (SPEC S10)."""
        now, policy = self._deps.clock.now_ms(), self._deps.policy
        # its run may still be live there: stopped once the upstream answers again (SPEC S10). Recorded first, so a
        # crash before the resubmit below cannot forget it (a stop of a run still followed is an interruption)
        await self._deps.gate.store.health.orphan(snapshot.view.upstream, action.hermes_run_id, now)
        snapshot = await self._commit(snapshot, lambda v: decide.on_upstream_lost(v, action.attempt, now, policy))
        if snapshot.view.attempt > action.attempt or snapshot.view.status.terminal:
            if self._pump is not None:
                await self._pump.close()
                self._pump = None
        if self.has_slot:
            await self._deps.gate.release(self.job_id, freed=False, upstream=self.slot_upstream)
            self.has_slot = False
        return snapshot

    async def _commit(
        self, snapshot: Snapshot, facts: Callable[[JobView], list[JobEvent]], *, retry: bool = True
    ) -> Snapshot:
        """Append what `facts` derives from the job (fenced by the lease), re-deriving it after a conflict."""
        with self._deps.leases.writing(self.job_id, self.token):  # a renewal meanwhile may find its lease released
            after = await self._deps.writer.commit(
                self.job_id,
                snapshot,
                facts,
                log=self._log,
                lease_token=self.token,
                retry=retry,
                released=self._released,
            )
        if after.view.attempt > snapshot.view.attempt:  # RunResubmitted
            attributes: tracing.Attributes = {
                tracing.ATTEMPT: after.view.attempt,
                tracing.RUN: snapshot.view.hermes_run_id,
            }
            tracing.start(tracing.RESUBMIT, attributes=attributes).end()
        return after

    def _released(self) -> None:
        """The write that ended the job released its run lease too: the supervisor's release costs nothing."""
        self._deps.leases.released(self.job_id, self.token)

    async def _reload(self) -> Snapshot:
        return await self._deps.writer.load(self.job_id)

    def _run_client(self, view: JobView) -> HermesClient:
        """The client of the upstream of the job's accepted run (SPEC S10: its attempt belongs to it)."""
        return self._deps.client(view.upstream)

    async def _sleep(self, ms: int | float, or_when: Coroutine[Any, Any, None] | None = None) -> None:
        """Sleep, or less when nudged (or when `or_when` happens first)."""
        if or_when is None:
            if await self._wake.sleep(max(ms, 0) / 1000):
                self._wake.clear()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        happened = asyncio.ensure_future(or_when)
        happened.add_done_callback(lambda _: release(waiter))
        try:
            await self._wake.wait(waiter, max(ms, 0) / 1000)
        finally:
            happened.cancel()
        self._wake.clear()
