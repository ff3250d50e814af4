"""Typed application keys (no string keys on the app)."""

from __future__ import annotations

import asyncio

from aiohttp import web
from redis.asyncio import Redis

from broker.clock import Clock
from broker.config import Config
from broker.hermes.client import HermesClient
from broker.hermes.fleet import Fleet
from broker.http.snapshot import LineSnapshot
from broker.jobs.memory_watch import MemoryWatch
from broker.jobs.service import JobService
from broker.metrics import Metrics
from broker.store.admission import AdmissionStore
from broker.store.callbacks import CallbackStore
from broker.store.jobs import JobStore
from broker.store.usage import UsageStore

admission_key = web.AppKey("admission", AdmissionStore)
config_key = web.AppKey("config", Config)
clock_key = web.AppKey("clock", Clock)
metrics_key = web.AppKey("metrics", Metrics)
redis_key = web.AppKey("redis", Redis)
service_key = web.AppKey("service", JobService)
store_key = web.AppKey("store", JobStore)
usage_key = web.AppKey("usage", UsageStore)  #: each fairness key's hourly usage (SPEC S4.5)
hermes_key = web.AppKey("hermes", HermesClient)  #: the first upstream's client (SPEC S10)
fleet_key = web.AppKey("fleet", Fleet)  #: every upstream with its client
draining_key = web.AppKey("draining", list[bool])  #: a one-element flag, set on SIGTERM
callbacks_key = web.AppKey("callbacks", CallbackStore)  #: job callbacks' delivery state (SPEC S5.8)
snapshot_key = web.AppKey("snapshot", LineSnapshot)  #: the line's figures as this replica last read them
memory_key = web.AppKey("memory", MemoryWatch)  #: how full Redis is, as this replica last read it (SPEC S4.4)
#: this replica's id: its log lines carry it, and a job it drives shows it as `owner` (SPEC S3.2)
replica_key = web.AppKey("replica", str)


def first_upstream(app: web.Application) -> str:
    """The first upstream's name (SPEC S10): a run accepted by a broker before S10 ran there."""
    return app[fleet_key].upstreams[0].name


class InFlight:
    """Requests being answered, so that a drain can wait for them while /readyz keeps answering 503."""

    def __init__(self) -> None:
        self.count = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def enter(self) -> None:
        self.count += 1
        self._idle.clear()

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight; False when `timeout_s` ran out first."""
        try:
            await asyncio.wait_for(self._idle.wait(), max(timeout_s, 0))
        except TimeoutError:
            return False
        return True


inflight_key = web.AppKey("inflight", InFlight)
