"""JobService: create, replay and read jobs. read -> fold -> decide -> append; IO only here."""

from __future__ import annotations

from attrs import frozen

from broker.clock import Clock
from broker.errors import IdempotencyConflict, JobNotFound
from broker.events import JobCreated
from broker.http.schemas import CreateRun
from broker.ids import job_id_for_key, new_job_id
from broker.logging import get_logger
from broker.metrics import Metrics
from broker.store.jobs import JobStore
from projections.job import JobView, apply


@frozen
class CreateResult:
    view: JobView
    replayed: bool


class JobService:
    """The job use cases the HTTP handlers call; handlers never touch Redis."""

    def __init__(self, store: JobStore, clock: Clock, metrics: Metrics) -> None:
        self._store = store
        self._clock = clock
        self._metrics = metrics
        self._log = get_logger(type(self))

    async def create(self, request: CreateRun) -> CreateResult:
        """Store a new job, or answer the one its Idempotency-Key already claimed."""
        key = request.idempotency_key
        event = JobCreated(
            job_id=job_id_for_key(key) if key else new_job_id(),
            at_ms=self._clock.now_ms(),
            body=request.body.decode(),
            fingerprint=request.fingerprint,
            idempotency_key=key,
            session_key=request.session_key,
            session_id=request.session_id,
            model=request.model,
            context=request.context,
            reporting=request.reporting,
        )
        view = apply(None, event)
        assert view is not None  # JobCreated always creates
        outcome = await self._store.create(event, view)
        existing = outcome.snapshot.view
        if outcome.created:
            self._metrics.jobs_created.inc()
            self._log.info("Created a job.", extra={"job": event.job_id, "idempotent": key is not None})
            return CreateResult(existing, replayed=False)
        if existing.fingerprint != request.fingerprint or existing.idempotency_key != key:
            self._log.warning("Rejected a conflicting idempotent create.", extra={"job": event.job_id})
            raise IdempotencyConflict()
        self._metrics.jobs_replayed.inc()
        self._log.info("Replayed a job.", extra={"job": existing.job_id, "status": existing.status.value})
        return CreateResult(existing, replayed=True)

    async def get(self, job_id: str) -> JobView:
        snapshot = await self._store.load(job_id)
        if snapshot is None:
            raise JobNotFound(job_id)
        return snapshot.view
