"""The admission line as the driver uses it (SPEC S4.1): the store's answers, logged once per change (S6)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from broker.driver.decide import Refused
from broker.logging import get_logger
from broker.metrics import Metrics
from broker.store.admission import AdmissionStore
from broker.store.grants import Grants, Refusal
from projections.job import JobView


class Gate:
    """Grants, acceptances, refusals and releases of admission slots; `wake` rings this replica's line."""

    def __init__(self, store: AdmissionStore, metrics: Metrics, wake: Callable[[], None] = lambda: None) -> None:
        self.store = store
        self._metrics = metrics
        self.wake = wake
        self._log = get_logger(type(self))

    async def admit(self, now_ms: int, most: int) -> Grants:
        return await self.store.admit(now_ms, most)

    def heard(self, job_id: str, newcomer: tuple[int, int] | None = None) -> None:
        """A `line` doorbell: the job joined the line (its partition is read by the next pass); `newcomer`:
        (score, advance) of a job that started at the line's virtual time."""
        self.store.heard(job_id, newcomer)

    async def accepted(self, job_id: str, now_ms: int, *, upstream: str | None = None) -> None:
        answer = await self.store.accepted(job_id, now_ms, upstream=upstream)
        if answer.ended_refusal:
            self._log.info("Hermes accepts creates again.", extra={"job": job_id})
        if answer.grew:
            fields = {"limit": answer.limit, "learnt": True, "upstream": upstream}
            self._log.info("Raised the admission limit.", extra=fields)
            self.wake()  # room for one more: the line moves now

    async def refused(
        self, job_id: str, refused: Refused, now_ms: int, *, jitter: float, place: str, upstream: str | None = None
    ) -> Refusal:
        answer = await self.store.refused(
            job_id,
            now_ms,
            reason=refused.reason,
            detail=refused.detail,
            retry_after_ms=refused.retry_after_ms,
            jitter=jitter,
            place=place,
            upstream=upstream,
        )
        self._metrics.refused_creates.labels(refused.reason.value).inc()
        if answer.began:
            fields = {
                "job": job_id,
                "hold": refused.reason.value,
                "error": refused.detail,
                "retryInMs": answer.retry_at_ms - now_ms,
                "upstream": upstream,
            }
            self._log.warning("Hermes is refusing creates; the line waits for one probe at a time.", extra=fields)
        if answer.limit_changed:
            fields = {"limit": answer.limit, "learnt": True, "upstream": upstream}
            self._log.info("Lowered the admission limit.", extra=fields)
        self.wake()  # the next probe's time may have moved
        return answer

    async def release(self, job_id: str, *, freed: bool, upstream: str | None = None) -> None:
        if await self.store.release(job_id, freed=freed, upstream=upstream):
            self._log.info("Hermes accepts creates again.", extra={"job": job_id})
        self.wake()  # a slot came back: the next job in line goes at once

    async def requeue(self, job_id: str, place: str, *, upstream: str | None = None) -> None:
        await self.store.requeue(job_id, place, upstream=upstream)
        self.wake()

    async def hold(
        self,
        job_ids: Iterable[str],
        now_ms: int,
        *,
        renew_only: bool = False,
        upstream: str | None = None,
        fairness_key: str | None = None,
    ) -> None:
        await self.store.hold(job_ids, now_ms, renew_only=renew_only, upstream=upstream, fairness_key=fairness_key)

    async def held(self, view: JobView) -> bool:
        """Is the job held out of the line by its key's quota or budget (SPEC S4.4)?"""
        quota = self.store.quota
        return quota is not None and quota.enforced and not view.status.terminal and await quota.is_held(view)

    async def enter(self, job_id: str, place: str) -> None:
        await self.store.enter(job_id, place)
