"""Board delivery (SPEC S5.3): reads the outbox through the `senders` group and POSTs each key's latest version.

Detached from the driver: a job transition only persists its version (and rings the outbox); delivery happens
here, at least once, under a token-owned per-key lock. A 2xx acknowledges exactly the version sent. After
releasing the lock the sender looks at the key again and drains a newer due version at once, including one
another replica persisted while the lock was held. A version that exhausted its attempts stays pending until
reconciliation; there is no retry loop here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import aiohttp
import orjson
from attrs import frozen

from broker import tracing
from broker.board.due import Deliver, DeliverySettings, Later, Replay, next_step
from broker.board.signing import signed_headers, webhook_id
from broker.clock import Clock
from broker.events import thread_key
from broker.logging import get_logger
from broker.metrics import Metrics
from broker.store import keys
from broker.store.board import BoardEntry, BoardStore, OutboxEntry, new_token
from broker.store.outage import REDIS_FAILURES, log_failure
from broker.tasks import cancel_all

READ_BLOCK_MS = 1_000
MAX_DRAINS = 32  #: keys one replica delivers at once
CLAIM_EVERY_S = 10.0  #: how often entries of dead consumers are looked for
_HEADERS = {"Content-Type": "application/json"}


@frozen
class _Handled:
    """The pending version the lock holder saw (None: none); it was delivered, exhausted or scheduled."""

    pending_at: int | None


class Sender:
    """One replica's board sender; `run()` is its outbox loop, `drain()` delivers one key."""

    def __init__(
        self,
        store: BoardStore,
        session: aiohttp.ClientSession,
        settings: DeliverySettings,
        clock: Clock,
        metrics: Metrics,
        *,
        consumer: str,
        trace_of: Callable[[str], Awaitable[str | None]] | None = None,
    ) -> None:
        self._store = store
        self._trace_of = trace_of  #: a job's stored trace context (SPEC S6.1)
        self._session = session
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._consumer = consumer
        self._slots = asyncio.Semaphore(MAX_DRAINS)
        self._tasks: set[asyncio.Task[None]] = set()
        self._log = get_logger(type(self))

    async def run(self) -> None:
        """Read the outbox forever; each batch of entries is drained in tasks, acknowledged when handled."""
        await self._store.ensure_group()
        next_claim = 0.0
        try:
            while True:
                entries: list[OutboxEntry] = []
                if time.monotonic() >= next_claim:
                    next_claim = time.monotonic() + CLAIM_EVERY_S
                    idle = self._settings.lock_ms + READ_BLOCK_MS
                    entries = await self._store.claim_stale(self._consumer, idle, count=MAX_DRAINS)
                if not entries:
                    await self._slots.acquire()  # wait for a free slot before taking more work
                    self._slots.release()
                    entries = await self._store.read_outbox(self._consumer, MAX_DRAINS, READ_BLOCK_MS)
                for job_id, batch in _by_job(entries).items():
                    await self._slots.acquire()
                    task = asyncio.create_task(self._handle(job_id, batch), name=f"board-{job_id}")
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        finally:
            await cancel_all(self._tasks)

    async def _handle(self, job_id: str, entries: list[OutboxEntry]) -> None:
        try:
            if job_id:
                await self.drain(job_id)
            await self._store.done(entries)
        except asyncio.CancelledError:
            if job_id:
                with contextlib.suppress(*REDIS_FAILURES):  # else a claim after the idle time retries it
                    await self._store.handover(job_id, entries)
            raise
        except Exception as error:  # the sender's loop guard: one key never stops the others; on an outage the
            # entry stays pending and a later claim retries it
            outage, bug = "Lost Redis while delivering a board report.", "A board delivery failed."
            log_failure(self._log, error, outage=outage, bug=bug, job=job_id)
        finally:
            self._slots.release()

    async def drain(self, job_id: str, *, replay: bool = False, replay_before_ms: int | None = None) -> None:
        """Deliver the key's due pending version (or, with `replay`, its acknowledged latest, unless it was
        delivered at `replay_before_ms` or later) until none is left."""
        while True:
            handled = await self._locked(job_id, replay=replay, replay_before_ms=replay_before_ms)
            if handled is None:
                return  # another replica holds the key: it drains after releasing
            replay = False
            entry = await self._store.load(job_id)
            if entry is None or entry.pending_at is None or entry.pending_at == handled.pending_at:
                return

    async def _locked(self, job_id: str, *, replay: bool, replay_before_ms: int | None = None) -> _Handled | None:
        lock, token = keys.board_lock(job_id), new_token()
        if not await self._store.acquire(lock, token, self._settings.lock_ms):
            # If the holder dies, look again once its lock has expired (the holder drains otherwise).
            ttl = await self._store.lock_ttl_ms(lock)
            await self._store.schedule(job_id, self._clock.now_ms() + ttl)
            self._log.debug("Found a board key locked by another sender.", extra={"job": job_id})
            return None
        self._log.debug("Acquired a board lock.", extra={"job": job_id})
        try:
            entry = await self._store.load(job_id)
            if entry is None:
                return _Handled(None)
            step = next_step(
                entry, self._clock.now_ms(), self._settings.refresh_ms, replay=replay, replay_before_ms=replay_before_ms
            )
            match step:
                case Deliver() | Replay():
                    with await self._span(entry, replay=isinstance(step, Replay)):
                        await self._post(entry, lock, token, replay=isinstance(step, Replay))
                case Later(due_at_ms=due):
                    await self._store.schedule(job_id, due)
                case None:
                    pass
            return _Handled(entry.pending_at)
        finally:
            with contextlib.suppress(*REDIS_FAILURES):  # else the lock expires on its own
                await self._store.release(lock, token)
                self._log.debug("Released a board lock.", extra={"job": job_id})

    async def _post(self, entry: BoardEntry, lock: str, token: str, *, replay: bool) -> None:
        """Up to BOARD_RETRIES attempts of exactly `entry.latest`; a 2xx acknowledges that version."""
        started = time.monotonic()
        fields: dict[str, object] = {"key": _report_field(entry, "key"), "at": entry.latest_at}
        error = ""
        for attempt in range(1, self._settings.retries + 1):
            if attempt > 1:
                await asyncio.sleep(self._settings.backoff(attempt - 1) / 1000)
                if not await self._store.holds(lock, token):
                    return  # the lock expired: another sender owns the key now and delivers it
            error = await self._send(entry)
            if not error:
                await self._store.ack(entry.job_id, entry.latest_at, self._clock.now_ms())
                self._metrics.board_deliveries.labels(outcome="replayed" if replay else "delivered").inc()
                done = {**fields, "state": _report_field(entry, "state"), "attempts": attempt}
                done["durationMs"] = round((time.monotonic() - started) * 1000, 1)
                message = "Replayed a board report." if replay else "Delivered a board report."
                self._log.info(message, extra=done)
                return
            if attempt < self._settings.retries:
                self._metrics.board_deliveries.labels(outcome="retried").inc()
                self._log.warning("Retried a board delivery.", extra={**fields, "attempt": attempt, "error": error})
        self._metrics.board_deliveries.labels(outcome="exhausted").inc()
        extra = {**fields, "attempts": self._settings.retries, "error": error}
        self._log.warning("Gave up a board delivery until reconciliation.", extra=extra)

    async def _span(self, entry: BoardEntry, *, replay: bool) -> tracing.Span:
        """A delivery's span in the job's trace (its stored context is read only when tracing)."""
        if not tracing.enabled() or self._trace_of is None:
            return tracing.NO_SPAN
        attributes: tracing.Attributes = {
            tracing.JOB: entry.job_id,
            "board.at": entry.latest_at,
            "board.replay": replay,
        }
        parent = await self._trace_of(entry.job_id)
        return tracing.start(tracing.BOARD, parent=parent, kind=tracing.Kind.CLIENT, attributes=attributes)

    async def _send(self, entry: BoardEntry) -> str:
        """POST the key's latest report, signed for this attempt when secrets are set; '' on a 2xx, else what
        went wrong."""
        timeout = aiohttp.ClientTimeout(total=self._settings.timeout_ms / 1000)
        body, message_id = entry.latest, webhook_id(thread_key(entry.job_id), entry.latest_at)
        headers = {**_HEADERS, **signed_headers(self._settings.secrets, message_id, self._clock.now_ms() // 1000, body)}
        try:
            async with self._session.post(self._settings.url, data=body, headers=headers, timeout=timeout) as answer:
                await answer.read()
                return "" if 200 <= answer.status < 300 else f"HTTP {answer.status}"
        except (aiohttp.ClientError, TimeoutError) as error:
            return repr(error)


def _by_job(entries: list[OutboxEntry]) -> dict[str, list[OutboxEntry]]:
    """Outbox entries grouped by job: one drain delivers whatever the key holds by then."""
    grouped: dict[str, list[OutboxEntry]] = {}
    for entry in entries:
        grouped.setdefault(entry.job_id, []).append(entry)
    return grouped


def _report_field(entry: BoardEntry, name: str) -> object:
    try:
        report = orjson.loads(entry.latest)
    except orjson.JSONDecodeError:
        return None
    return report.get(name) if isinstance(report, dict) else None
