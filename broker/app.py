"""Composition root of the served broker: config -> the Redis clients and stores, the job service, the driver,
the delta sweep, the board, the console -> one aiohttp app (the HTTP edge's, `broker/http/app.py`).

Every arrow points down from here: `http/` serves what this module hands it through typed app keys, and only
this module knows the driver, the board and the console all at once (STYLE C.1).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from aiohttp import web
from redis.asyncio import Redis

from broker.admission.cost import CostSettings
from broker.admission.fair import FairnessSettings, VirtualTimes
from broker.admission.pacing import Pacing
from broker.board.projector import BoardSettings
from broker.board.service import BoardService
from broker.callbacks.outbox import CallbackSettings
from broker.callbacks.sender import CallbackDelivery, CallbackSender
from broker.clock import Clock, SystemClock
from broker.config import Config
from broker.console import routes as console
from broker.driver.deps import Deps
from broker.driver.gate import Gate
from broker.driver.supervisor import DRAIN_WAIT_S, Supervisor
from broker.errors import LegacyLayout
from broker.hermes.client import HermesClient
from broker.hermes.fleet import Fleet
from broker.http import sse
from broker.http.app import Context, web_app
from broker.http.appkeys import (
    InFlight,
    admission_key,
    callbacks_key,
    clock_key,
    config_key,
    draining_key,
    fleet_key,
    hermes_key,
    inflight_key,
    memory_key,
    metrics_key,
    redis_key,
    replica_key,
    service_key,
    snapshot_key,
    store_key,
    usage_key,
)
from broker.http.render import job_object
from broker.http.snapshot import LineSnapshot
from broker.ids import new_replica_id
from broker.jobs.conversation import Conversations
from broker.jobs.deltas import SWEEP_S, DeltaSweep
from broker.jobs.fair_top import FairTopUpkeep
from broker.jobs.memory_watch import MemoryWatch
from broker.jobs.policy import Policy
from broker.jobs.service import JobService
from broker.jobs.usage import UsageSweep
from broker.jobs.writer import Writer
from broker.logging import get_logger
from broker.metrics import Metrics
from broker.store import work
from broker.store.admission import AdmissionStore
from broker.store.affinity import Affinity
from broker.store.callbacks import CallbackStore
from broker.store.connection import connect
from broker.store.deltas import DeltaSchedule
from broker.store.durability import Durability
from broker.store.entries import settle_fresh_store
from broker.store.fair_top import FairTopRepair
from broker.store.jobs import JobStore
from broker.store.leases import Leases
from broker.store.migrate import MIGRATION_COMMAND, legacy_keys
from broker.store.quota import QuotaStore
from broker.store.scripts import Scripts
from broker.store.sessions import SessionStore
from broker.store.upstream_admission import slots_of
from broker.store.usage import UsageStore
from broker.tasks import cancel_all
from projections.job import JobView

#: what only the composition root reaches: the HTTP edge never touches the driver, the board or the writer
board_key = web.AppKey("board", BoardService)
supervisor_key = web.AppKey("supervisor", Supervisor)
writer_key = web.AppKey("writer", Writer)
#: sessions' turns in order (SPEC S4.3), for the service and the runners
conversations_key = web.AppKey("conversations", Conversations)
callback_sender_key = web.AppKey("callback_sender", CallbackSender)  #: this replica's (with allowed hosts)


def create_app(
    config: Config,
    *,
    redis_url: str | None = None,
    clock: Clock | None = None,
    hermes: HermesClient | None = None,
    drive: bool = True,
    replica: str | None = None,
) -> web.Application:
    """Build the broker app; `redis_url` overrides `config.redis_url` (the embedded server's URL).

    `drive=False` serves the API without driving jobs (tests of the HTTP surface alone); `hermes` replaces the
    first upstream's client; `replica` is this process's id (the one its log lines carry; a new one if None).
    """
    services: list[Context] = [_redis_context(redis_url or config.redis_url)]
    if drive:
        services.extend((_driver_context, _fair_top_context, _usage_context))
    if config.runs_delta_retention_ms:
        services.append(_deltas_context)
    if config.board_enabled:
        services.append(_board_context)
    if config.callback_allowed_hosts:  # without allowed hosts no create takes a callback, and none is delivered
        services.append(_callbacks_context)
    app = web_app(services)
    app[config_key] = config
    app[replica_key] = replica or new_replica_id()
    app[clock_key] = clock or SystemClock()
    app[metrics_key] = Metrics()
    app[draining_key] = [False]
    app[snapshot_key] = LineSnapshot()
    app[inflight_key] = InFlight()
    # one client per upstream, each with its own key (SPEC S10); `hermes` (a test's) stands in for the first. With
    # several, no call waits longer than the lost window: a frozen host is found lost within it, not a timeout later
    timeout_ms = config.hermes_timeout_ms
    if len(config.upstreams) > 1:
        timeout_ms = min(timeout_ms, config.hermes_upstream_lost_ms)
    app[fleet_key] = Fleet.build(config.upstreams, timeout_ms, observe=app[metrics_key].observe_hermes, first=hermes)
    app[hermes_key] = app[fleet_key].first
    app.on_cleanup.append(_close_hermes)
    if config.console_enabled:
        console.register(app)
    return app


def _redis_context(url: str | None) -> Context:
    async def context(app: web.Application) -> AsyncIterator[None]:
        if url is None:
            raise RuntimeError("create_app needs a Redis URL (REDIS_URL, or the embedded server's)")
        config = app[config_key]
        redis = connect(url, cluster=config.redis_cluster)
        log = get_logger("broker.app.Redis")
        try:
            await redis.ping()
            found = await legacy_keys(redis)
            if found:
                raise LegacyLayout(found, MIGRATION_COMMAND)
            # before the work stream exists: it marks a store a broker has used
            if await settle_fresh_store(redis, only_replica=config.redis_url is None):
                log.info("Storing relayed events packed: no other broker reads this store.")
            await work.ensure_group(redis)
        except BaseException:
            await redis.aclose()
            raise
        log.info("Connected to Redis.", extra={"redis": _safe(url), "cluster": config.redis_cluster})
        if len(app[fleet_key]) > 1:
            upstreams = ",".join(u.name for u in app[fleet_key].upstreams)
            log.info("Routing jobs to several Hermes upstreams.", extra={"upstreams": upstreams})
        app[redis_key] = redis
        durability = Durability(config.redis_wait_replicas, config.redis_wait_timeout_ms)
        virtual = VirtualTimes()  # the line's virtual time (SPEC S4.2): passes learn it, creates read it
        app[store_key] = JobStore(
            redis,
            retention_ms=config.runs_retention_ms,
            hold_ms=config.runs_hold_ms,
            durability=durability,
            delta_retention_ms=config.runs_delta_retention_ms,
            virtual=virtual,
            cost=CostSettings.from_config(config),
        )
        app[usage_key] = UsageStore(redis, retention_ms=config.runs_retention_ms)
        app[admission_key] = AdmissionStore(
            redis,
            Pacing.from_config(config),
            virtual,
            slots_of(app[fleet_key].upstreams),
            affinity=_affinity(app, redis),
            replica=app[replica_key],
            quota=QuotaStore(redis, config.admission_quotas, app[usage_key]) if config.admission_quotas else None,
            cost=(CostSettings.from_config(config), config.runs_retention_ms),
        )
        app[conversations_key] = Conversations(
            SessionStore(redis, retention_ms=config.runs_retention_ms),
            app[store_key],
            app[admission_key].enter,
            history_turns=config.runs_session_history_turns,
            client_of=app[fleet_key].client_or_first,
            lost=app[admission_key].lost,
        )
        board = BoardSettings.from_config(config)
        memory = app[memory_key] = MemoryWatch(redis, config.redis_memory_high)  # creates read its verdict
        app[callbacks_key] = CallbackStore(redis)
        app[writer_key] = Writer(app[store_key], app[clock_key], app[metrics_key], board, _callback_settings(app))
        app[service_key] = JobService(
            app[writer_key],
            app[clock_key],
            app[metrics_key],
            redis=redis,
            hermes=app[hermes_key],
            admission=app[admission_key],
            fairness=FairnessSettings.from_config(config),
            client_of=app[fleet_key].client_or_first,
            memory=memory,
            conversations=app[conversations_key],
            session_history=config.runs_session_history,
            quotas=config.admission_quotas,
            max_waiting=config.admission_max_waiting,
        )
        await app[store_key].warm(app[clock_key].now_ms())
        await memory.start()
        yield
        await memory.stop()
        await redis.aclose()
        log.info("Disconnected from Redis.", extra={"redis": _safe(url)})

    return context


async def _driver_context(app: web.Application) -> AsyncIterator[None]:
    config = app[config_key]
    gate = Gate(app[admission_key], app[metrics_key])
    deps = Deps(
        writer=app[writer_key],
        leases=Leases(app[redis_key], lease_ms=config.runs_lease_ms),
        gate=gate,
        hermes=app[hermes_key],
        clock=app[clock_key],
        metrics=app[metrics_key],
        policy=Policy.from_config(config),
        poll_interval_ms=config.runs_poll_interval_ms,
        upstream=app[fleet_key].upstreams[0].name,
        fleet=app[fleet_key],
        affinity=_affinity(app, app[redis_key]),
        conversations=app[conversations_key],
    )
    supervisor = Supervisor(
        app[redis_key],
        deps,
        concurrency=config.runs_concurrency,
        replica=app[replica_key],
        drain_wait_s=min(DRAIN_WAIT_S, config.shutdown_grace_ms / 2000),  # half the grace: the rest for requests
    )
    gate.wake = supervisor.ring
    app[supervisor_key] = supervisor
    supervisor.start()
    yield
    await drain(app)


def _affinity(app: web.Application, redis: Redis) -> Affinity | None:
    """Sessions' upstreams (SPEC S10), kept only when there is a choice: one URL stores nothing more than before."""
    return Affinity(redis, app[config_key].runs_retention_ms) if len(app[fleet_key]) > 1 else None


async def _deltas_context(app: web.Application) -> AsyncIterator[None]:
    """Every replica sweeps the delta schedules (SPEC S3.6)."""
    every_s = min(SWEEP_S, app[config_key].runs_delta_retention_ms / 2000)
    sweep = DeltaSweep(DeltaSchedule(app[redis_key]), app[clock_key], every_s=every_s)
    sweep.start()
    yield
    await sweep.stop()


async def _usage_context(app: web.Application) -> AsyncIterator[None]:
    """Every driving replica counts the usage facts its and the others' job writes left (SPEC S4.5)."""
    quota = app[admission_key].quota
    budgets = quota.budgets if quota is not None else None
    sweep = UsageSweep(app[usage_key], app[metrics_key], budgets=budgets, settle=app[store_key].settle_missed)
    sweep.start()
    yield
    await sweep.stop()


async def _fair_top_context(app: web.Application) -> AsyncIterator[None]:
    """Every driving replica mends the keys with most waiting jobs that an older broker left (SPEC S4.2)."""
    redis = app[redis_key]
    upkeep = FairTopUpkeep(FairTopRepair(redis, Scripts(redis).fair_top_repair))
    upkeep.start()
    yield
    await upkeep.stop()


async def _board_context(app: web.Application) -> AsyncIterator[None]:
    """Board delivery (SPEC S5): detached from the driver, stopped first on the way out."""
    board = BoardService(
        app[config_key],
        app[redis_key],
        app[writer_key],
        app[hermes_key],
        app[clock_key],
        app[metrics_key],
        client_of=app[fleet_key].client_or_first,
        replica=app[replica_key],
    )
    app[board_key] = board
    await board.start()
    yield
    await board.stop()


def _callback_settings(app: web.Application) -> CallbackSettings:
    """What job writes need to owe callbacks: the job object as callers see it, and how long deliveries live."""
    first, config = app[fleet_key].upstreams[0].name, app[config_key]

    def render(view: JobView) -> dict[str, Any]:
        return job_object(view, first)

    def owed() -> None:
        if callback_sender_key in app:
            app[callback_sender_key].owed()

    return CallbackSettings(
        render=render,
        retention_ms=config.runs_retention_ms,
        retry_window_ms=config.callback_retry_window_ms,
        owed=owed,
    )


async def _callbacks_context(app: web.Application) -> AsyncIterator[None]:
    """Job callback delivery (SPEC S5.8): every replica claims due deliveries; stopped before Redis closes."""
    session = aiohttp.ClientSession()
    settings = CallbackDelivery.from_config(app[config_key])
    sender = app[callback_sender_key] = CallbackSender(
        app[callbacks_key], session, settings, app[clock_key], app[metrics_key]
    )
    task = asyncio.create_task(sender.run(), name="callback-sender")
    get_logger("broker.app.Callbacks").info("Started job callback delivery.")
    yield
    await cancel_all([task])
    await session.close()


async def drain(app: web.Application) -> None:
    """SIGTERM: report not ready, stop taking work and hand driven jobs back (once)."""
    if app[draining_key][0]:
        return
    app[draining_key][0] = True
    if board_key in app:
        await app[board_key].stop()  # in-flight deliveries are handed to the other replicas' senders
    if supervisor_key in app:
        await app[supervisor_key].drain()
    await sse.end_streams(app)


async def _close_hermes(app: web.Application) -> None:
    await app[fleet_key].aclose()


def _safe(url: str) -> str:
    """The URL without a password."""
    if "@" not in url:
        return url
    scheme, _, rest = url.partition("://")
    return f"{scheme}://***@{rest.rpartition('@')[2]}"
