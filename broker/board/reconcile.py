"""Board reconciliation (SPEC S5.6): at startup and every BOARD_RECONCILE_INTERVAL, on one replica per interval.

A pass walks the retained index (keys whose `sourceActivityAt + HERMES_TTL` is still ahead), repairs active
entries nobody drives, delivers every due pending version (including those that exhausted their attempts) and
replays every acknowledged latest version byte for byte. Expired index entries are dropped.
"""

from __future__ import annotations

import asyncio
import time

from attrs import define

from broker.board.repair import Repair, Repairer
from broker.board.sender import Sender
from broker.clock import Clock
from broker.logging import get_logger
from broker.store import keys
from broker.store.board import RETAINED_PAGE, BoardStore, new_token
from broker.store.outage import is_outage

CONCURRENCY = 8  #: keys reconciled at once


@define
class PassStats:
    keys: int = 0
    repaired: int = 0
    expired: int = 0


class Reconciler:
    def __init__(
        self, store: BoardStore, sender: Sender, repairer: Repairer | None, clock: Clock, *, interval_ms: int
    ) -> None:
        self._store = store
        self._sender = sender
        self._repairer = repairer
        self._clock = clock
        self._interval_ms = interval_ms
        self._log = get_logger(type(self))

    async def run(self) -> None:
        """Try a pass now and after every interval; the lock lets one replica per interval do it."""
        while True:
            await self.try_pass()
            await asyncio.sleep(self._interval_ms / 1000)

    async def try_pass(self) -> PassStats | None:
        """One pass unless another replica did one within the interval (its lock is still there)."""
        # Never released: its TTL is the interval, so the next pass anywhere is one interval later.
        if not await self._store.acquire(keys.BOARD_RECONCILE_LOCK, new_token(), self._interval_ms):
            self._log.debug("Skipped a board reconciliation done by another replica.")
            return None
        return await self.reconcile()

    async def reconcile(self) -> PassStats:
        started, began_ms = time.monotonic(), self._clock.now_ms()
        stats = PassStats(expired=await self._store.forget_expired(began_ms))
        slots = asyncio.Semaphore(CONCURRENCY)

        async def one(job_id: str) -> None:
            async with slots:
                try:
                    await self._key(job_id, stats, began_ms)
                except Exception as error:  # the pass's loop guard: one key never stops the others
                    if is_outage(error):
                        raise  # the pass fails; the next interval tries again
                    extra = {"job": job_id, "error": repr(error)}
                    self._log.error("Failed to reconcile a board key.", exc_info=True, extra=extra)

        offset = 0
        while True:
            page = await self._store.retained(self._clock.now_ms(), offset, RETAINED_PAGE)
            await asyncio.gather(*(one(job_id) for job_id in page))
            stats.keys += len(page)
            if len(page) < RETAINED_PAGE:
                break
            offset += len(page)
        fields = {"keys": stats.keys, "repaired": stats.repaired, "expired": stats.expired}
        self._log.info(
            "Reconciled the board.", extra={**fields, "durationMs": round((time.monotonic() - started) * 1000, 1)}
        )
        return stats

    async def _key(self, job_id: str, stats: PassStats, began_ms: int) -> None:
        # repair first: a settled job gets a new pending version, so the stale `running` is not replayed
        if self._repairer is not None:
            outcome = await self._repairer.repair(job_id)
            if outcome in (Repair.SETTLED, Repair.RESUBMITTED):
                stats.repaired += 1
        await self._sender.drain(job_id, replay=True, replay_before_ms=began_ms)
