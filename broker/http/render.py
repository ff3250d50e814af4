"""The job object of SPEC S3.2, rendered from a job view (float epoch seconds, as Hermes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

from broker.events import Context, HoldReason
from projections.job import JobView

DEFAULT_MODEL = "hermes-agent"
#: `hold.detail` of a hold recorded before details were (never null while a hold is set, SPEC S3.2).
HOLD_DETAILS = {
    HoldReason.BUSY: "Hermes is at capacity.",
    HoldReason.DRAINING: "Hermes is draining.",
    HoldReason.UNAVAILABLE: "Hermes is unavailable.",
    HoldReason.SESSION: "An earlier turn of its session runs.",
}


def json_response(document: object, *, status: int = 200, headers: Mapping[str, str] | None = None) -> web.Response:
    """A JSON answer encoded with orjson (aiohttp's default encoder, the stdlib's, cost a tenth of a create)."""
    return web.Response(
        body=orjson.dumps(document), status=status, headers=headers, content_type="application/json", charset="utf-8"
    )


def seconds(ms: int) -> float:
    return ms / 1000


def job_object(
    view: JobView,
    default_upstream: str | None = None,
    owner: str | None = None,
    callback: Mapping[str, object] | None = None,
) -> dict[str, Any]:
    """The job object; `default_upstream` (the first upstream's name, SPEC S10) is the upstream of a run accepted
    by a broker before S10 (its `job.accepted` names none); `owner` the replica driving it (None: none does);
    `callback`: the job's callback state (SPEC S5.8), shown when given (a callback's own payload carries the job
    object without it)."""
    document: dict[str, Any] = {
        "object": "hermes.run",
        "run_id": view.job_id,
        "status": view.status.value,
        "created_at": seconds(view.created_at_ms),
        "updated_at": seconds(view.updated_at_ms),
        "session_id": view.session_id,
        "model": view.model or DEFAULT_MODEL,
        "last_event": view.last_event,
        "attempts": view.attempts,
        "hermes_run_id": view.hermes_run_id,
        "hold": _hold(view),
        "output": view.output,
        "usage": orjson.loads(view.usage) if view.usage else None,
        "error": {"code": view.error_code, "message": view.error_message or ""} if view.error_code else None,
    }
    if view.context is not None:
        document["context"] = context_object(view.context)
    document["reporting"] = {"board": view.reporting.board, "post": view.reporting.post}
    scheduling = view.scheduling
    document["scheduling"] = {
        "priority": scheduling.priority,
        "fairness_key": scheduling.fairness_key,
        "fairness_weight": scheduling.fairness_weight,
        "multitask": scheduling.multitask,
    }
    document["upstream"] = view.upstream or (default_upstream if view.attempts else None)
    document["owner"] = owner
    if view.dropped_deltas:
        document["dropped_deltas"] = view.dropped_deltas
    if callback is not None:
        document["callback"] = dict(callback)
    return document


def context_object(context: Context) -> dict[str, Any]:
    document: dict[str, Any] = {"title": context.title}
    if context.url is not None:
        document["url"] = context.url
    if context.links is not None:
        document["links"] = [{"text": link.text, "url": link.url} for link in context.links]
    return document


def _hold(view: JobView) -> dict[str, Any] | None:
    if view.hold is None:
        return None
    return {
        "reason": view.hold.reason.value,
        "since": seconds(view.hold.since_ms),
        "retry_at": seconds(view.hold.retry_at_ms),
        "detail": view.hold.detail or HOLD_DETAILS[view.hold.reason],
    }
