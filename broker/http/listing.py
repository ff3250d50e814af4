"""GET /v1/runs (SPEC S3.9): the broker's jobs, most recently changed first, filtered and paged."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping

from aiohttp import web
from attrs import evolve, frozen

from broker.errors import InvalidRequest
from broker.events import JobStatus
from broker.http import appkeys
from broker.http.render import job_object, json_response
from broker.store.listing import Listing, Page, Position

DEFAULT_LIMIT = 50
MAX_LIMIT = 200
_CURSOR = re.compile(r"([0-9]{1,16}):(job_[!-~]{1,300})")
_STATUSES = ", ".join(status.value for status in JobStatus)


@frozen
class Query:
    statuses: tuple[JobStatus, ...]  #: empty: every status
    limit: int
    after: Position | None

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> Query:
        """The listing parameters; InvalidRequest `invalid_field` naming the bad one."""
        return cls(_statuses(query.get("status")), _limit(query.get("limit")), decode_cursor(query.get("cursor")))


def _statuses(raw: str | None) -> tuple[JobStatus, ...]:
    if raw is None:
        return ()
    names = [name.strip() for name in raw.split(",")]
    if not all(name in JobStatus._value2member_map_ for name in names):
        raise InvalidRequest("invalid_field", f"status must be a comma-separated list of: {_STATUSES}", param="status")
    return tuple(dict.fromkeys(JobStatus(name) for name in names))


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise InvalidRequest("invalid_field", f"limit must be an integer from 1 to {MAX_LIMIT}", param="limit")
    return int(raw)


def encode_cursor(position: Position) -> str:
    return base64.urlsafe_b64encode(f"{position.score}:{position.job_id}".encode()).decode().rstrip("=")


def decode_cursor(raw: str | None) -> Position | None:
    if raw is None:
        return None
    try:
        text = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode("ascii")
    except (binascii.Error, ValueError):
        text = ""
    match = _CURSOR.fullmatch(text)
    if match is None:
        raise InvalidRequest("invalid_field", "cursor must be the next_cursor of a previous page", param="cursor")
    return Position(int(match[1]), match[2])


async def list_page(app: web.Application, query: Query) -> Page:
    """One page of the listing (also what the console shows)."""
    listing = Listing(app[appkeys.redis_key], retention_ms=app[appkeys.config_key].runs_retention_ms)
    page = await listing.page(query.statuses, query.limit, query.after, app[appkeys.clock_key].now_ms())
    return evolve(page, jobs=await app[appkeys.service_key].with_line_holds(page.jobs))  # as GET shows them


async def list_runs(request: web.Request) -> web.Response:
    page = await list_page(request.app, Query.parse(request.query))
    return json_response(
        {
            "object": "list",
            "data": [job_object(view, appkeys.first_upstream(request.app)) for view in page.jobs],
            "next_cursor": encode_cursor(page.next) if page.next else None,
        }
    )


def register(app: web.Application) -> None:
    app.router.add_get("/v1/runs", list_runs)
