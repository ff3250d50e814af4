"""Every replica's delta sweep (SPEC S3.6): a finished job's message deltas go RUNS_DELTA_RETENTION after it
ended. Two replicas may look at the same due job; its script runs once (it takes the job off the schedule)."""

from __future__ import annotations

import asyncio

from broker.clock import Clock
from broker.logging import get_logger
from broker.store.deltas import DeltaSchedule
from broker.store.outage import is_outage, outage_name
from broker.tasks import cancel_all

SWEEP_S = 2.0  #: how often a replica looks at the schedules (a removal is late by at most this)


class DeltaSweep:
    def __init__(self, schedule: DeltaSchedule, clock: Clock, *, every_s: float = SWEEP_S) -> None:
        self._schedule = schedule
        self._clock = clock
        self._every_s = every_s
        self._task: asyncio.Task[None] | None = None
        self._log = get_logger(DeltaSweep)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="delta-sweep")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_all([self._task])
            self._task = None

    async def sweep(self) -> int:
        """One pass: the deltas of every due job removed; the number of entries removed."""
        now = self._clock.now_ms()
        due = await self._schedule.due(now)
        if not due:
            return 0
        removed = [count for count in await self._schedule.remove(due, now) if count > 0]
        if removed:
            self._log.debug(
                "Removed finished jobs' message deltas.", extra={"jobs": len(removed), "removed": sum(removed)}
            )
        return sum(removed)

    async def _run(self) -> None:
        while True:
            try:
                await self.sweep()
            except Exception as error:  # the loop guard: log, and look again next time
                if is_outage(error):
                    self._log.warning("Lost Redis in the delta sweep.", extra={"error": outage_name(error)})
                else:
                    self._log.error("The delta sweep failed.", exc_info=True, extra={"error": repr(error)})
            await asyncio.sleep(self._every_s)
