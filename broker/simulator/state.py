"""The simulator's in-memory state: settings, runs with their single-use event buffers, the request log."""

from __future__ import annotations

import asyncio
import time
import uuid

import attrs
from attrs import define

from broker.simulator.wire import TERMINAL_STATUSES, JsonObject

RESTART_ERROR = "The gateway restarted before this run settled."


@define
class Settings:
    """What a test or `/_sim/settings` can change while the simulator runs."""

    api_key: str | None = None
    max_concurrent: int = 10  # 0 = no cap, as in Hermes
    busy: bool = False  # every create answers 429
    draining: bool = False  # every create answers 503 gateway_draining
    upstream_main: bool = False  # honour Idempotency-Key and report `interrupted` after a restart
    delay_s: float = 0.0  # added before every /v1 answer
    keepalive_s: float = 30.0
    approval_timeout_s: float = 60.0
    events_wait_s: float = 1.0  # how long /events waits for an unknown run before its 404 (Hermes: 20 x 50 ms)
    step_s: float = 0.05  # pause between streamed deltas when no `sleep:N` marker sets the pace
    proxy_max_body: int = 0  # a proxy in front answers bodies over this many bytes with its HTML 413; 0 = no proxy


@define(eq=False)
class RunStream:
    """One run's event buffer: every event queues until the first subscriber drains it; single use."""

    queue: asyncio.Queue[JsonObject | None] = attrs.field(factory=asyncio.Queue)
    # Subscribers' connections. Hermes lets a second subscriber attach while the first is still there; the two
    # then compete for events. The buffer is dropped when any subscriber leaves.
    transports: set[asyncio.Transport] = attrs.field(factory=set)

    def drop_subscribers(self) -> None:
        """Break every subscriber's connection without a terminal event."""
        for transport in list(self.transports):
            transport.abort()


@define(eq=False)
class SimRun:
    """A run's pollable record plus the machinery that drives it."""

    run_id: str
    session_id: str
    model: str
    created_at: float
    updated_at: float
    status: str = "queued"
    last_event: str | None = None
    output: str | None = None
    usage: JsonObject | None = None
    error: str | None = None
    idempotency_key: str | None = None
    stream: RunStream | None = attrs.field(factory=RunStream)
    task: asyncio.Task[None] | None = None
    approval: asyncio.Future[str] | None = None  # the pending approval prompt's answer
    stopping: bool = False

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def set_status(self, status: str, *, last_event: str | None = None) -> None:
        self.status = status
        self.updated_at = time.time()
        if last_event is not None:
            self.last_event = last_event

    def emit(self, name: str, **fields: object) -> None:
        """Queue an event for the stream (dropped once the stream is gone, as in Hermes)."""
        if name != "message.delta":
            self.updated_at = time.time()
            self.last_event = name
        if self.stream is not None:
            self.stream.queue.put_nowait({"event": name, "run_id": self.run_id, "timestamp": time.time(), **fields})

    def close_stream(self) -> None:
        if self.stream is not None:
            self.stream.queue.put_nowait(None)

    def to_api(self) -> JsonObject:
        payload: JsonObject = {
            "object": "hermes.run",
            "run_id": self.run_id,
            "status": self.status,
            "updated_at": self.updated_at,
            "created_at": self.created_at,
            "session_id": self.session_id,
            "model": self.model,
        }
        optional = {"last_event": self.last_event, "output": self.output, "usage": self.usage, "error": self.error}
        payload.update({key: value for key, value in optional.items() if value is not None})
        return payload


@define
class Simulator:
    """Everything one simulated Hermes process knows; `restart()` forgets what a real restart forgets."""

    settings: Settings
    runs: dict[str, SimRun] = attrs.field(factory=dict)
    idempotency: dict[str, tuple[str, str]] = attrs.field(factory=dict)  # key -> (fingerprint, run_id)
    requests: list[JsonObject] = attrs.field(factory=list)
    refuse_until: float = 0.0  # monotonic time until which /v1 connections are dropped
    creates: dict[str, int] = attrs.field(factory=dict)  # answers to POST /v1/runs by status ("202", "429", ...)
    peak_live: int = 0  # most live runs at once since the last stats reset

    def count_create(self, status: int) -> None:
        """Tally one create's answer; an accepted one may raise the peak of live runs."""
        self.creates[str(status)] = self.creates.get(str(status), 0) + 1
        if status == 202:
            self.peak_live = max(self.peak_live, self.active_count())

    def stats(self) -> JsonObject:
        settled = sum(1 for run in self.runs.values() if run.terminal)
        live = self.active_count()
        peak = max(self.peak_live, live)
        return {"live": live, "peak_live": peak, "runs": len(self.runs), "settled": settled, "creates": self.creates}

    def reset_stats(self) -> None:
        self.creates.clear()
        self.peak_live = self.active_count()

    def new_run(self, *, session_id: str | None, model: str, idempotency_key: str | None) -> SimRun:
        run_id = f"run_{uuid.uuid4().hex}"
        now = time.time()
        run = SimRun(run_id, session_id or run_id, model, now, now, idempotency_key=idempotency_key)
        self.runs[run_id] = run
        return run

    def active_count(self) -> int:
        """Runs that hold a concurrency slot: every run whose task has not finished, stopping ones included."""
        return sum(1 for run in self.runs.values() if run.task is not None and not run.task.done())

    def refusing(self) -> bool:
        return time.monotonic() < self.refuse_until

    async def restart(self, *, cancel: bool, down_s: float) -> None:
        """Forget every run, as a restarted Hermes does.

        With `cancel`, live runs first end `cancelled` and their streams get `run.cancelled` (SIGTERM with no
        drain window); without it, streams just break (SIGKILL). In upstream-main mode, runs created with an
        Idempotency-Key are durable: those that had not settled come back as `interrupted`.
        """
        live = [run for run in self.runs.values() if run.task is not None and not run.task.done()]
        if cancel:
            for run in live:
                run.stopping = True
                run.task.cancel()  # type: ignore[union-attr]  # `live` only holds runs with a task
            await asyncio.gather(*(run.task for run in live if run.task is not None), return_exceptions=True)
        for run in self.runs.values():
            if run.stream is not None:
                run.stream.drop_subscribers()
            if run.task is not None and not run.task.done():
                run.task.cancel()
        kept: dict[str, SimRun] = {}
        if self.settings.upstream_main:
            for run in self.runs.values():
                if run.idempotency_key is not None:
                    kept[run.run_id] = _survivor(run)
        else:
            self.idempotency.clear()
        self.runs = kept
        self.settings.busy = self.settings.draining = False
        self.refuse_until = time.monotonic() + down_s


def _survivor(run: SimRun) -> SimRun:
    """The durable record upstream main keeps of a keyed run across a restart."""
    survivor = SimRun(
        run.run_id,
        run.session_id,
        run.model,
        run.created_at,
        run.updated_at,
        status=run.status,
        last_event=run.last_event,
        output=run.output,
        usage=run.usage,
        error=run.error,
        idempotency_key=run.idempotency_key,
        stream=None,
    )
    if not run.terminal:
        survivor.set_status("interrupted", last_event="run.interrupted")
        survivor.error = RESTART_ERROR
    return survivor
