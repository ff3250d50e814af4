"""The board machinery of one replica (SPEC S5): sender, refresh promoter and reconciler, started and stopped together.

Everything here runs beside the driver and never blocks a job transition; one aiohttp session carries every
delivery. Each loop survives Redis outages (log, back off, go on).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import aiohttp
from redis.asyncio import Redis

from broker.board.due import DeliverySettings
from broker.board.reconcile import Reconciler
from broker.board.repair import Repairer
from broker.board.sender import Sender
from broker.clock import Clock
from broker.config import Config
from broker.hermes.client import HermesClient
from broker.hermes.fleet import ClientOf
from broker.ids import new_replica_id
from broker.jobs.policy import Policy
from broker.jobs.writer import Writer
from broker.logging import get_logger
from broker.metrics import Metrics
from broker.store.board import BoardStore
from broker.store.outage import log_failure
from broker.tasks import cancel_all

MAX_REDIS_BACKOFF_S = 5.0
PROMOTE_LIMIT = 100


class BoardService:
    def __init__(
        self,
        config: Config,
        redis: Redis,
        writer: Writer,
        hermes: HermesClient,
        clock: Clock,
        metrics: Metrics,
        client_of: ClientOf | None = None,
        replica: str = "",
    ) -> None:
        self.replica = replica or new_replica_id()
        self.store = BoardStore(redis)
        self._settings = DeliverySettings.from_config(config)
        self._reconcile_ms = config.board_reconcile_interval_ms
        self._writer = writer
        self._hermes = hermes
        self._client_of = client_of  #: each run's upstream's client (SPEC S10)
        self._clock = clock
        self._metrics = metrics
        self._policy = Policy.from_config(config)
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._log = get_logger(type(self))

    async def start(self) -> None:
        """Create the senders' group, then run the sender, the promoter and the reconciler in the background."""
        await self.store.ensure_group()
        self._session = aiohttp.ClientSession()
        sender = Sender(
            self.store,
            self._session,
            self._settings,
            self._clock,
            self._metrics,
            consumer=self.replica,
            trace_of=self._writer.store.traceparent,
        )
        repairer = Repairer(self._writer, self.store, self._hermes, self._clock, self._policy, self._client_of)
        reconciler = Reconciler(self.store, sender, repairer, self._clock, interval_ms=self._reconcile_ms)
        loops = {"board-sender": sender.run, "board-promoter": self._promote, "board-reconciler": reconciler.run}
        for name, loop in loops.items():
            self._tasks.append(asyncio.create_task(self._guarded(loop), name=name))
        self._log.info("Started board delivery.", extra={"replica": self.replica})

    async def stop(self) -> None:
        """Cancel the loops (in-flight deliveries release their locks) and close the session; idempotent."""
        tasks, self._tasks = self._tasks, []
        await cancel_all(tasks)
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()
            self._log.info("Stopped board delivery.", extra={"replica": self.replica})

    async def _promote(self) -> None:
        """Move coalesced refreshes that are due onto the outbox (every replica; the script promotes each once)."""
        interval = max(0.05, min(1.0, self._settings.refresh_ms / 4000))
        while True:
            promoted = await self.store.promote_due(self._clock.now_ms(), PROMOTE_LIMIT)
            if len(promoted) < PROMOTE_LIMIT:
                await asyncio.sleep(interval)

    async def _guarded(self, loop: Callable[[], Awaitable[None]]) -> None:
        delay = 0.1
        while True:
            try:
                await loop()
                return
            except Exception as error:  # the loops' guard: an outage is expected, anything else a bug
                log_failure(
                    self._log, error, outage="Lost Redis in a board loop.", bug="A board loop failed.", retryS=delay
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_REDIS_BACKOFF_S)
