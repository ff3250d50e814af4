"""Operations routes: /healthz (process), /readyz (Redis, draining, Hermes, queue age), /metrics."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from broker.admission.state import LineState, UpstreamFigures
from broker.events import HoldReason
from broker.http.appkeys import (
    admission_key,
    clock_key,
    config_key,
    draining_key,
    hermes_key,
    memory_key,
    metrics_key,
    redis_key,
    snapshot_key,
)
from broker.http.render import json_response
from broker.http.snapshot import LineSnapshot
from broker.store import quota_view
from broker.store.connection import cluster_state, is_cluster
from broker.store.outage import REDIS_FAILURES
from broker.upstreams.condition import Condition
from broker.upstreams.health import Heard

READY_TIMEOUT_S = 2.0


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    report = await ready_report(request.app)
    return json_response(report, status=200 if report["status"] == "ready" else 503)


async def ready_report(app: web.Application) -> dict[str, object]:
    """What /readyz answers (also shown by the console): Redis, draining, Hermes, the queue, `status`."""
    report: dict[str, object] = {
        "redis": False,
        "draining": app[draining_key][0],
        "hermes_answered": hermes_answered(app, ()),
    }
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            await app[redis_key].ping()
            admission, line = await _admission(app, fresh=True)
            quotas = await _quotas(app, line)
            if quotas is not None:
                admission["quotas"] = quotas
        report["redis"] = True
        report["hermes_answered"] = hermes_answered(app, line.upstreams)
        report["queue_depth"] = admission["line"]  # queued: waiting in the admission line for a Hermes run
        report["oldest_queued_age_ms"] = admission["oldest_wait_ms"]
        report["scheduled_jobs"] = line.scheduled
        report["admission"] = admission
        if is_cluster(app[redis_key]):
            cluster = report["cluster"] = await cluster_state(app[redis_key])
            report["redis"] = cluster["state"] == "ok"
            if not report["redis"]:
                report["reason"] = "redis cluster state is not ok"
    except REDIS_FAILURES as error:
        report["reason"] = f"redis unavailable: {type(error).__name__}"
    if report["draining"]:
        report["reason"] = "draining"
    ready = report["redis"] is True and not report["draining"]
    report["status"] = "ready" if ready else "not_ready"
    app[metrics_key].ready.set(int(ready))
    return report


async def _admission(app: web.Application, *, fresh: bool) -> tuple[dict[str, object], LineState]:
    """The admission line (SPEC S3.8, S4.1): live runs against the limit, the line, the refusal; gauges too. Read
    afresh, or (not `fresh`) this replica's read of the last MAX_AGE_S (broker/http/snapshot.py)."""
    admission, clock = app[admission_key], app[clock_key]

    async def read() -> LineState:
        return await admission.state(clock.now_ms())

    snapshot = app.get(snapshot_key) or LineSnapshot()
    line = await (snapshot.fresh(read) if fresh else snapshot.recent(read))
    metrics = app[metrics_key]
    metrics.queue_depth.set(line.waiting)
    metrics.oldest_queued_age.set((line.oldest_wait_ms or 0) / 1000)
    gauges = metrics.admission
    for name, value in (
        ("live_runs", line.live),
        ("limit", line.limit),
        ("limit_learnt", int(line.learnt)),
        ("line_length", line.waiting),
        ("oldest_wait_seconds", (line.oldest_wait_ms or 0) / 1000),
        ("refusing", int(line.refusing is not None)),
        ("probes", line.probes),
        ("refused", line.refused),
        ("session_waiting", line.session_waiting),
    ):
        gauges[name].set(value)
    for priority, count in enumerate(line.by_priority, start=1):
        metrics.admission_waiting.labels(str(priority)).set(count)
    for upstream in line.upstreams:
        for name, value in (
            ("live_runs", upstream.live),
            ("limit", upstream.limit),
            ("limit_learnt", int(upstream.learnt)),
            ("refusing", int(upstream.refusing is not None)),
            ("lost", int(upstream.lost)),
            ("unreachable", int(upstream.unreachable_since_ms > 0)),
            ("busy", int(upstream.condition is Condition.BUSY)),
            ("probes", upstream.probes),
            ("refused", upstream.refused),
        ):
            metrics.upstream[name].labels(upstream.name).set(value)
    return {
        "live": line.live,
        "limit": line.limit,
        "learnt": line.learnt,
        "refusing": line.refusing is not None,
        "reason": line.refusing.value if line.refusing else None,
        "detail": (line.detail or None) if line.refusing else None,
        "retry_at": line.retry_at_ms / 1000 if line.refusing else None,
        "line": line.waiting,
        "oldest_wait_ms": line.oldest_wait_ms,
        "probes": line.probes,
        "refused": line.refused,
        "waiting_by_priority": {str(priority): count for priority, count in enumerate(line.by_priority, start=1)},
        "waiting_ahead": line.ahead,  # resubmits, and first attempts an older broker placed
        "session_waiting": line.session_waiting,  # turns waiting for an earlier turn of their session (S4.3)
        "top_keys": [{"key": load.key, "waiting": load.waiting, "weight": load.weight} for load in line.keys],
        # each upstream's own admission (SPEC S10); the fields above are the first upstream's
        "upstreams": [_upstream(upstream) for upstream in line.upstreams],
    }, line


async def _quotas(app: web.Application, line: LineState) -> list[dict[str, object]] | None:
    """Each key's use of its quota (SPEC S4.4), nearest its limits first; None without live or token quotas."""
    quota = app[admission_key].quota
    if quota is None:
        return None
    waiting = {load.key: load.waiting for load in line.keys}
    figures = await quota_view.figures(quota, app[clock_key].now_ms(), also=waiting)
    return [
        {
            "key": figure.key,
            "live": figure.live,
            "live_quota": figure.quota.live,
            "waiting": waiting.get(figure.key, 0) + figure.held,
            "waiting_quota": figure.quota.waiting,
            "held": figure.held,
            "held_for": figure.held_for,
            "tokens_used": figure.tokens_used,
            "tokens_quota": figure.quota.tokens,
            "window": figure.quota.window,
            "retry_at": figure.retry_at_ms / 1000 if figure.retry_at_ms else None,
        }
        for figure in figures
    ]


def _upstream(upstream: UpstreamFigures) -> dict[str, object]:
    refusing = upstream.refusing
    busy = refusing is None and upstream.condition is Condition.BUSY  # at its limit: held here, not refused
    return {
        "name": upstream.name,
        "condition": upstream.condition.value,
        "live": upstream.live,
        "limit": upstream.limit,
        "learnt": upstream.learnt,
        "refusing": refusing is not None,
        "reason": refusing.value if refusing else (HoldReason.BUSY.value if busy else None),
        "detail": upstream.detail or None,
        "retry_at": upstream.retry_at_ms / 1000 if refusing else None,
        "lost": upstream.lost,
        # while calls to it fail (SPEC S10): when that began
        "unreachable_since": upstream.unreachable_since_ms / 1000 if upstream.unreachable_since_ms else None,
    }


def hermes_answered(app: web.Application, upstreams: tuple[UpstreamFigures, ...]) -> bool | None:
    """Does Hermes answer? Not while calls to an upstream fail (their shared health, SPEC S10); else with several
    upstreams yes, with one whether this replica's last call to it was answered (None: no call yet)."""
    if any(upstream.unreachable_since_ms > 0 for upstream in upstreams):
        return False
    if len(upstreams) > 1:
        return True
    heard: Heard | None = getattr(app[hermes_key], "heard", None)
    if heard is None or (heard.answered_ms == 0 and not heard.failing):
        return None
    return not heard.failing


async def metrics(request: web.Request) -> web.Response:
    app = request.app
    registry = app[metrics_key]
    answered = False
    with contextlib.suppress(*REDIS_FAILURES):
        async with asyncio.timeout(READY_TIMEOUT_S):
            await _admission(app, fresh=False)  # sets the queue and admission gauges
            answered = True
    # what /readyz would answer, without its PING: the read above needed Redis to answer
    registry.ready.set(int(answered and not app[draining_key][0]))
    if memory_key in app:
        registry.observe_memory(app[memory_key].readings, app[config_key].redis_memory_high, app[memory_key].refusing)
    return web.Response(body=registry.render(), content_type="text/plain", charset="utf-8")


def register(app: web.Application) -> None:
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
