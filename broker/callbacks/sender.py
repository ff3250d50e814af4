"""Delivers job callbacks (SPEC S5.8): every replica claims due deliveries from the partitions' schedules.

One attempt per claim: a failure is written back with its next due time (backoff with jitter, never before the
receiver's Retry-After), so a retry survives this replica and any replica may make it. A claim lapses after the
longest attempt, so a replica killed mid-delivery leaves the delivery to another one (at least once; the
receiver deduplicates on `webhook-id`). Redirects are not followed: the allowlist judged the URL, not its target.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from email.utils import parsedate_to_datetime

import aiohttp
from attrs import field, frozen
from yarl import URL

from broker.board.signing import signed_headers
from broker.callbacks.hosts import allowed_url
from broker.callbacks.outbox import retry_in_ms
from broker.clock import Clock
from broker.config import Config
from broker.logging import get_logger
from broker.metrics import Metrics
from broker.store.callbacks import CallbackStore, Outcome, Owed
from broker.store.outage import REDIS_FAILURES, log_failure
from broker.tasks import cancel_all

CLAIM_MARGIN_MS = 2_000  #: a claim outlives its attempt by this much
POLL_S = 1.0  #: the longest pause between rounds that found nothing due (a write of this replica ends it)
MAX_DELIVERIES = 32  #: most deliveries in flight on one replica: a round claims no more than the free places
#: most deliveries in flight to one receiver (scheme, host and port) from one replica: a receiver that never
#: answers holds these until their timeout, and the other receivers' deliveries keep the remaining places
MAX_PER_RECEIVER = MAX_DELIVERIES // 2
#: the longest a delivery waits for a place at its receiver before it looks again (it backs off up to this while
#: the receiver stays busy): a receiver that is only slow gets its waiting deliveries soon after places free
MAX_DEFER_MS = 30_000
MAX_REDIS_BACKOFF_S = 5.0


@frozen(kw_only=True)
class CallbackDelivery:
    """The S2 settings of callback delivery (durations in milliseconds)."""

    timeout_ms: int = 10_000  #: BOARD_TIMEOUT: per attempt
    retry_window_ms: int = 86_400_000  #: CALLBACK_RETRY_WINDOW
    secrets: tuple[bytes, ...] = field(default=(), repr=False)  #: CALLBACK_SIGNING_SECRET's keys
    allowed_hosts: tuple[str, ...] = ()  #: CALLBACK_ALLOWED_HOSTS: a URL it no longer allows is not called

    @classmethod
    def from_config(cls, config: Config) -> CallbackDelivery:
        return cls(
            timeout_ms=config.board_timeout_ms,
            retry_window_ms=config.callback_retry_window_ms,
            secrets=config.callback_signing_secrets,
            allowed_hosts=config.callback_allowed_hosts,
        )

    @property
    def claim_ms(self) -> int:
        return self.timeout_ms + CLAIM_MARGIN_MS


def webhook_headers(secrets: tuple[bytes, ...], message_id: str, timestamp_s: int, body: bytes) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt; `webhook-signature` only when secrets are set."""
    unsigned = {"Content-Type": "application/json", "webhook-id": message_id, "webhook-timestamp": str(timestamp_s)}
    return {**unsigned, **signed_headers(secrets, message_id, timestamp_s, body)}


class CallbackSender:
    """One replica's callback sender: `run()` claims due deliveries and makes one attempt of each."""

    def __init__(
        self,
        store: CallbackStore,
        session: aiohttp.ClientSession,
        settings: CallbackDelivery,
        clock: Clock,
        metrics: Metrics,
    ) -> None:
        self._store = store
        self._session = session
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._tasks: set[asyncio.Task[None]] = set()
        self._receivers: Counter[str] = Counter()  #: deliveries in flight per receiver
        self._owed = asyncio.Event()  #: set when a write of this replica owed a delivery
        self._log = get_logger(type(self))

    def owed(self) -> None:
        """A job write of this replica owed a delivery: look at once instead of at the next round."""
        self._owed.set()

    async def run(self) -> None:
        """Claim and deliver forever; a Redis outage is logged and waited out."""
        delay = 0.1
        try:
            while True:
                self._owed.clear()  # before the claim: a write owing one from now on wakes the next wait
                try:
                    claimed = await self._round()
                    delay = 0.1
                except Exception as error:  # the loop's guard: an outage is expected, anything else a bug
                    log_failure(
                        self._log, error, outage="Lost Redis in the callback sender.",
                        bug="The callback sender failed.", retryS=delay,
                    )  # fmt: skip
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_REDIS_BACKOFF_S)
                    continue
                if not claimed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._owed.wait(), POLL_S)
        finally:
            await cancel_all(self._tasks)

    async def _round(self) -> int:
        """Claim what is due and start a delivery of each; how many were claimed (or 1 after waiting for a
        delivery to end, when all slots were busy)."""
        free = MAX_DELIVERIES - len(self._tasks)
        if free <= 0:
            await asyncio.wait(set(self._tasks), return_when=asyncio.FIRST_COMPLETED)
            return 1
        claimed = await self._store.claim(self._clock.now_ms(), self._settings.claim_ms, free)
        for job_id in claimed:
            task = asyncio.create_task(self._deliver(job_id), name=f"callback-{job_id}")
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return len(claimed)

    async def _deliver(self, job_id: str) -> None:
        try:
            owed = await self._store.first_owed(job_id)
            if owed is None:
                await self._store.idle(job_id, self._clock.now_ms())
                return
            receiver = _receiver(owed.url)
            if self._receivers[receiver] >= MAX_PER_RECEIVER:
                # its receiver is busy with this replica's deliveries: try later, backing off as it stays busy
                pause = min(retry_in_ms(owed.deferrals + 1, random.random()), MAX_DEFER_MS)
                due = self._clock.now_ms() + pause
                await self._store.defer(owed, due)
                return
            self._receivers[receiver] += 1
            try:
                await self._attempt(owed)
            finally:
                self._receivers[receiver] -= 1
                if not self._receivers[receiver]:
                    del self._receivers[receiver]
        except asyncio.CancelledError:
            # Stopping: the job is due again at once, for any sender (else once its claim lapses). An attempt that
            # reached the receiver is made again: at least once.
            with contextlib.suppress(*REDIS_FAILURES):
                await self._store.idle(job_id, self._clock.now_ms())
            raise
        except Exception as error:  # one job never stops the others; its claim lapses and another attempt follows
            log_failure(
                self._log, error, outage="Lost Redis while delivering a job callback.",
                bug="A job callback delivery failed.", job=job_id,
            )  # fmt: skip

    async def _attempt(self, owed: Owed) -> None:
        started = time.monotonic()
        if allowed_url(owed.url, self._settings.allowed_hosts):
            status, error, retry_after_ms = await self._post(owed)
        else:
            # taken off the allowlist since the job was created (or not on this replica's): not called, and tried
            # again like a failed attempt, so a replica that allows it may deliver it within the retry window
            status, error, retry_after_ms = None, "its host is not in CALLBACK_ALLOWED_HOSTS", None
        now = self._clock.now_ms()
        fields: dict[str, object] = {"job": owed.job_id, "webhookId": owed.webhook_id, "attempt": owed.failures + 1}
        outcome: Outcome
        retry_at = 0
        if status is not None and 200 <= status < 300:
            outcome = "delivered"
            self._log.info("Delivered a job callback.", extra={**fields, "durationMs": _since(started)})
        elif status == 410:
            outcome = "gone"
            self._log.info("Stopped a job's callbacks: its receiver answered 410.", extra=fields)
        else:
            retry_at = now + retry_in_ms(owed.failures + 1, random.random(), retry_after_ms)
            if retry_at > owed.owed_since_ms + self._settings.retry_window_ms:
                outcome = "failed"
                self._log.warning("Gave up a job callback after its retry window.", extra={**fields, "error": error})
            else:
                outcome = "retry"
                self._log.warning("Retried a job callback.", extra={**fields, "error": error, "retryAt": retry_at})
        self._metrics.callback_deliveries.labels(outcome="retried" if outcome == "retry" else outcome).inc()
        await self._store.record(owed, outcome, error=error, retry_at_ms=retry_at, now_ms=now)

    async def _post(self, owed: Owed) -> tuple[int | None, str, int | None]:
        """One POST: (status or None, error ('' on a 2xx), Retry-After in ms or None)."""
        timeout = aiohttp.ClientTimeout(total=self._settings.timeout_ms / 1000)
        headers = webhook_headers(self._settings.secrets, owed.webhook_id, self._clock.now_ms() // 1000, owed.body)
        try:
            async with self._session.post(
                owed.url, data=owed.body, headers=headers, timeout=timeout, allow_redirects=False
            ) as answer:
                # The status is the answer: the body is never read, so a receiver that trickles one cannot hold
                # an acknowledged delivery until the timeout, nor make this replica keep what it sends.
                if 200 <= answer.status < 300:
                    return answer.status, "", None
                retry_after = _retry_after_ms(answer.headers.get("Retry-After"), self._clock.now_ms())
                return answer.status, f"HTTP {answer.status}", retry_after
        except (aiohttp.ClientError, TimeoutError, ValueError) as error:
            # ValueError: a URL the client cannot send to (stored by a broker that checked less): a failed attempt,
            # backed off and given up like any other, not an error that skips the record
            return None, repr(error), None


def _retry_after_ms(value: str | None, now_ms: int) -> int | None:
    """Retry-After in ms: delta seconds or an HTTP date; None when absent or unreadable."""
    if not value:
        return None
    seconds = value.strip()
    if seconds.isascii() and seconds.isdigit():  # past 10 digits (over 300 years) it is only later than any window
        return (int(seconds) if len(seconds) <= 10 else 9_999_999_999) * 1000
    try:
        return max(0, int(parsedate_to_datetime(value).timestamp() * 1000) - now_ms)
    except (TypeError, ValueError):
        return None


def _receiver(url: str) -> str:
    """The receiver a URL names: its scheme, host and port."""
    try:
        return str(URL(url).origin())
    except ValueError:
        return url


def _since(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)
