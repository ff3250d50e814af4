"""What the console pages show, gathered from the same sources as the API: /readyz's report, the listing
(S3.9), the job object (S3.2), its SSE feed (S3.3) and the board hash. Never the input or instructions."""

from __future__ import annotations

import collections
import datetime
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web
from attrs import frozen

from broker.events import JobStatus
from broker.http import appkeys
from broker.http.callbacks import callback_documents
from broker.http.health import ready_report
from broker.http.listing import Query, encode_cursor, list_page, page_owners
from broker.http.render import job_object
from broker.jobs.conversation import SessionTurns
from broker.store.board import BoardStore
from broker.store.jobs import Snapshot
from broker.store.listing import Listing
from broker.store.stats import board_outbox_lag
from projections.feed import shown
from projections.job import JobView

HELD_SCAN = 400  #: queued jobs (newest change first) looked at for the held-by-reason counts
TIMELINE_LIMIT = 5000  #: events rendered into the page; the live stream carries on after the last one
SESSION_TURNS = 20  #: a session's unfinished turns listed on a job page (the rest are counted)
SESSION_RECENT = 10  #: a session's latest completed turns listed on a job page
SUMMARY_FIELDS = ("tool", "preview", "delta", "reason", "detail", "command", "choice", "error", "output")
SUMMARY_CHARS = 200
ACTIVE = "queued,running,waiting_for_approval,stopping"
FILTERS = ("", ACTIVE, *(status.value for status in JobStatus))


def when(seconds: float | None) -> str:
    """Epoch seconds as a UTC time (the format console.js writes too)."""
    if seconds is None:
        return "—"
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def shown_value(value: Any) -> str:
    """A field value as text (the format console.js writes too): strings as they are, the rest as JSON."""
    if value is None:
        return "—"
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def summary(payload: Mapping[str, Any]) -> str:
    """A short line of an event's notable fields."""
    parts = []
    for name in SUMMARY_FIELDS:
        if payload.get(name) is not None:
            text = shown_value(payload[name])
            parts.append(f"{name}: {text[:SUMMARY_CHARS]}{'…' if len(text) > SUMMARY_CHARS else ''}")
    return " · ".join(parts)


@frozen
class Row:
    job: dict[str, Any]  #: the job object

    @property
    def title(self) -> str:
        context = self.job.get("context")
        return str(context["title"]) if context else ""

    @property
    def hold_reason(self) -> str:
        hold = self.job["hold"]
        return str(hold["reason"]) if hold else ""


async def overview(app: web.Application, query: Mapping[str, str]) -> dict[str, Any]:
    parsed = Query.parse(query)
    report = await ready_report(app)
    page = await list_page(app, parsed)
    admission = report.get("admission")
    return {
        "report": report,
        "admission": admission if isinstance(admission, dict) else None,
        **await _held_by_reason(app),
        "board_lag": await board_outbox_lag(app[appkeys.redis_key]) if app[appkeys.config_key].board_enabled else None,
        "rows": [
            Row(job_object(view, appkeys.first_upstream(app), owner))
            for view, owner in zip(page.jobs, await page_owners(app, page), strict=True)
        ],
        "status": ",".join(status.value for status in parsed.statuses),
        "limit": parsed.limit,
        "next_cursor": encode_cursor(page.next) if page.next else None,
        "filters": FILTERS,
    }


async def _held_by_reason(app: web.Application) -> dict[str, Any]:
    """`held`: reason -> count over the queued jobs; `held_scanned`: how many were looked at when not all."""
    listing = Listing(app[appkeys.redis_key], retention_ms=app[appkeys.config_key].runs_retention_ms)
    counts: collections.Counter[str] = collections.Counter()
    after, looked, more = None, 0, True
    while more and looked < HELD_SCAN:
        page = await listing.page([JobStatus.QUEUED], 200, after, app[appkeys.clock_key].now_ms())
        shown = await app[appkeys.service_key].with_line_holds(page.jobs)  # the line's hold, as GET shows it
        counts.update(view.hold.reason.value for view in shown if view.hold is not None)
        looked += len(page.jobs)
        after, more = page.next, page.next is not None
    return {"held": dict(sorted(counts.items())), "held_scanned": looked if more else None}


async def job_page(app: web.Application, snapshot: Snapshot) -> dict[str, Any]:
    job_id = snapshot.view.job_id
    entries = await app[appkeys.store_key].read(job_id, count=TIMELINE_LIMIT)
    timeline = [
        {"id": entry_id, "event": str(doc.get("event", "")), "at": when(doc.get("timestamp")), "summary": summary(doc)}
        for entry_id, doc, _ in shown(job_id, entries)
    ]
    service = app[appkeys.service_key]
    (owner,) = await service.owners([snapshot.view])
    callback = (await callback_documents(app, [snapshot.view])).get(job_id)
    job = job_object(await service.with_line_hold(snapshot.view), appkeys.first_upstream(app), owner)
    return {
        "job": job,
        "fields": [(name, value) for name, value in job.items() if name != "object"],
        "terminal": snapshot.view.status.terminal,
        "timeline": timeline,
        "last_event_id": entries[-1][0] if entries else "",
        "truncated": len(entries) >= TIMELINE_LIMIT,
        "board": await _board(app, job_id) if app[appkeys.config_key].board_enabled else None,
        "callback": _callback(callback),
        "session": _session(
            job_id,
            await app[appkeys.service_key].session_turns(snapshot.view, most=SESSION_TURNS, recent=SESSION_RECENT),
        ),
    }


@frozen
class TurnRow:
    """One turn of a session on a job page."""

    job_id: str
    status: str  #: "expired" when the turn's job is gone
    place: str  #: "completed", "holder" (it holds the session) or "waiting"
    hold_reason: str  #: an unfinished turn's hold, as the job list shows it ("" without one)
    hold_detail: str
    current: bool  #: the page's own job


def _session(job_id: str, turns: SessionTurns | None) -> dict[str, Any] | None:
    """The rows of the job's session: its latest completed turns, then the unfinished ones in order."""
    if turns is None:
        return None
    rows = [_turn_row(job_id, turn, view, "completed") for turn, view in turns.completed]
    for i, (turn, view) in enumerate(turns.unfinished):
        rows.append(_turn_row(job_id, turn, view, "holder" if i == 0 else "waiting"))
    return {"session_id": turns.session_id, "rows": rows, "more": turns.more}


def _turn_row(job_id: str, turn: str, view: JobView | None, place: str) -> TurnRow:
    if view is None:
        return TurnRow(turn, "expired", place, "", "", turn == job_id)
    hold = view.hold if place != "completed" else None
    reason, detail = (hold.reason.value, hold.detail or "") if hold is not None else ("", "")
    return TurnRow(turn, view.status.value, place, reason, detail, turn == job_id)


def _callback(document: dict[str, object] | None) -> dict[str, str] | None:
    """The job's callback (SPEC S5.8) as the job page shows it; None for a job without one."""
    if document is None:
        return None
    return {name: shown_value(document[name]) for name in ("url", "status", "attempts", "last_error")}


async def _board(app: web.Application, job_id: str) -> dict[str, str] | None:
    entry = await BoardStore(app[appkeys.redis_key]).load(job_id)
    if entry is None:
        return None
    state = orjson.loads(entry.latest).get("state") if entry.latest else None
    delivery = "acknowledged" if entry.acked_at == entry.latest_at else "pending"
    return {
        "state": shown_value(state),
        "latest at": str(entry.latest_at),
        "delivery": delivery,
        "pending version": shown_value(entry.pending_at),
        "acknowledged version": shown_value(entry.acked_at),
        "last delivered": when(entry.delivered_ms / 1000) if entry.delivered_ms else "—",
        "expires": when(entry.expire_at / 1000),
    }
