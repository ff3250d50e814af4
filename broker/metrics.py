"""Prometheus metrics of one replica (SPEC S3.8), on a registry of its own. docs/reference/metrics.md describes
each (a test holds it to this registry)."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest

from broker.jobs.room import NOTHING, need
from broker.store.memory import NodeMemory


class Metrics:
    """Every metric the broker exports; one instance per app, so tests never share counters."""

    def __init__(self) -> None:
        # No `_created` series: a creation time per counter doubles the series and tells an operator nothing that
        # the process start does not (prometheus-client's switch is process-wide; every registry here wants it off)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.jobs_created = Counter("hbr_jobs_created", "Jobs created.", registry=r)
        self.jobs_replayed = Counter("hbr_jobs_replayed", "Idempotent replays.", registry=r)
        self.jobs_finished = Counter("hbr_jobs_finished", "Jobs finished.", ["status"], registry=r)
        self.holds = Counter("hbr_holds", "Times Hermes did not accept a job.", ["reason"], registry=r)
        self.resubmits = Counter("hbr_resubmits", "Interrupted jobs resubmitted.", registry=r)
        self.takeovers = Counter("hbr_takeovers", "Jobs taken over from another replica.", registry=r)
        self.hermes_latency = Histogram(
            "hbr_hermes_call_seconds", "Hermes call latency.", ["method", "route", "status"], registry=r
        )
        self.board_deliveries = Counter("hbr_board_deliveries", "Board deliveries.", ["outcome"], registry=r)
        #: job callback attempts by outcome: delivered, retried, failed (retry window over), gone (410)
        self.callback_deliveries = Counter("hbr_callback_deliveries", "Job callback attempts.", ["outcome"], registry=r)
        self.sse_open = Gauge("hbr_sse_streams_open", "Open SSE streams.", registry=r)
        self.queue_depth = Gauge("hbr_queue_depth", "Jobs waiting in the admission line.", registry=r)
        self.oldest_queued_age = Gauge("hbr_oldest_queued_seconds", "Age of the oldest queued job.", registry=r)
        self.refused_creates = Counter(
            "hbr_hermes_refused_creates", "Creates Hermes refused (this replica).", ["reason"], registry=r
        )
        #: creates answered without a job, by reason: `queue_full` (a key's `waiting` quota or ADMISSION_MAX_WAITING,
        #: SPEC S4.4), `redis_memory` (past REDIS_MEMORY_HIGH), `outage` (a 503 of an unreachable, failing-over or
        #: full Redis), `session_busy` (a turn with multitask reject, SPEC S4.3)
        self.creates_not_taken = Counter("hbr_creates_refused", "Creates not taken, by reason.", ["reason"], registry=r)
        self.admission = {
            name: Gauge(f"hbr_admission_{name}", text, registry=r)
            for name, text in (
                ("live_runs", "The broker's runs live on Hermes (all replicas)."),
                ("limit", "The admission limit on live runs."),
                ("limit_learnt", "1 when the limit is learnt, 0 when HERMES_MAX_CONCURRENT pins it."),
                ("line_length", "Jobs waiting in the admission line."),
                ("oldest_wait_seconds", "How long the oldest queued job has waited."),
                ("refusing", "1 while the first upstream takes no create (Hermes refuses them, or calls fail)."),
                ("probes", "Probes sent while Hermes refused (all replicas)."),
                ("refused", "Creates Hermes refused (all replicas)."),
                ("session_waiting", "Turns waiting for an earlier turn of their session (all replicas)."),
            )
        }

        #: each upstream's admission (SPEC S10), labelled by its name
        self.upstream = {
            name: Gauge(f"hbr_upstream_{name}", text, ["upstream"], registry=r)
            for name, text in (
                ("live_runs", "The broker's runs live on this upstream (all replicas)."),
                ("limit", "This upstream's admission limit on live runs."),
                ("limit_learnt", "1 when this upstream's limit is learnt, 0 when HERMES_MAX_CONCURRENT pins it."),
                ("refusing", "1 while this upstream takes no create (Hermes refuses them, or calls to it fail)."),
                ("lost", "1 while this upstream is lost (no answer to any call for HERMES_UPSTREAM_LOST)."),
                ("unreachable", "1 while calls to this upstream fail (refused, reset, timed out), lost or not yet."),
                ("busy", "1 while this upstream answers 429 or the broker's live runs on it reached its limit."),
                ("probes", "Probes sent while this upstream refused (all replicas)."),
                ("refused", "Creates this upstream refused (all replicas)."),
            )
        }
        self.admission_waiting = Gauge(
            "hbr_admission_waiting",
            "First attempts waiting in the admission line, per priority (SPEC S4.2).",
            ["priority"],
            registry=r,
        )

        self.ready = Gauge("hbr_ready", "1 while this replica is ready (/readyz answers 200), else 0.", registry=r)
        node = ["node"]
        self.redis_used = Gauge("hbr_redis_memory_used_bytes", "Redis used_memory, per node.", node, registry=r)
        self.redis_max = Gauge("hbr_redis_memory_max_bytes", "Redis maxmemory, per node (0: none).", node, registry=r)
        self.redis_guard = Gauge(
            "hbr_redis_memory_guard_ratio",
            "What the memory guard counts on a node (used plus a reserve per unfinished job) over its mark"
            " (REDIS_MEMORY_HIGH of maxmemory): creates are refused from 1.",
            node,
            registry=r,
        )
        self.redis_refusing = Gauge(
            "hbr_redis_memory_refusing", "1 while this replica refuses creates: Redis is nearly full.", registry=r
        )
        #: what the runs this replica counted used (SPEC S4.5); each run is counted by one replica, so the sum over
        #: replicas is the whole broker's
        self.hermes_seconds = Counter(
            "hbr_hermes_seconds", "Hermes slot time of settled runs (counted by this replica).", registry=r
        )
        self.tokens = Counter(
            "hbr_tokens", "Tokens of completed runs by kind (counted by this replica).", ["kind"], registry=r
        )
        for kind in ("input", "output", "total"):
            self.tokens.labels(kind)

    def observe_memory(self, readings: Sequence[NodeMemory], high: float, refusing: bool) -> None:
        """The memory watch's last reading (no Redis call of its own)."""
        for node in readings:
            self.redis_used.labels(node.node).set(node.used)
            self.redis_max.labels(node.node).set(node.maxmemory)
            mark = high * node.maxmemory
            self.redis_guard.labels(node.node).set(need(node, NOTHING) / mark if mark > 0 else 0)
        self.redis_refusing.set(int(refusing))

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def observe_hermes(self, method: str, route: str, status: int | None, seconds: float) -> None:
        self.hermes_latency.labels(method, route, "error" if status is None else str(status)).observe(seconds)
