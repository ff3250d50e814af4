"""GET /v1/usage (SPEC S4.5): one fairness key's hourly or daily buckets, or the keys that used most Hermes time."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from aiohttp import web
from attrs import frozen

from broker.errors import InvalidRequest
from broker.http import appkeys
from broker.http.render import json_response
from broker.jobs.usage_report import DAY_S, Bucket, Range, key_buckets, record, top_keys

DEFAULT_LIMIT = 50
MAX_LIMIT = 1000
MAX_KEY_LENGTH = 256  #: the longest fairness key a job can have (one taken from X-Hermes-Session-Key)


@frozen
class UsageQuery:
    key: str | None  #: None: the top keys
    range: Range
    bucket: Bucket
    limit: int

    @classmethod
    def parse(cls, query: Mapping[str, str], now_s: float) -> UsageQuery:
        """The parameters; InvalidRequest `invalid_field` naming the bad one."""
        key = query.get("key")
        if key is not None and len(key) > MAX_KEY_LENGTH:
            raise _invalid("key", f"key must be at most {MAX_KEY_LENGTH} characters")
        until = _seconds(query, "until", now_s)
        since = _seconds(query, "since", until - DAY_S)
        if since >= until:
            raise _invalid("since", "since must be before until")
        bucket = query.get("bucket", "hour")
        if bucket not in ("hour", "day"):
            raise _invalid("bucket", "bucket must be hour or day")
        return cls(key, Range(since_s=since, until_s=until), "day" if bucket == "day" else "hour", _limit(query))


_NUMBER = re.compile(r"[0-9]+(\.[0-9]*)?([eE][+-]?[0-9]+)?")


def _invalid(param: str, message: str) -> InvalidRequest:
    return InvalidRequest("invalid_field", message, param=param)


def _seconds(query: Mapping[str, str], name: str, default: float) -> float:
    raw = query.get(name)
    if raw is None:
        return default
    # a plain number: float() alone also takes surrounding whitespace, underscores and "inf"
    value = float(raw) if _NUMBER.fullmatch(raw) else math.nan
    if not math.isfinite(value) or value < 0:
        raise _invalid(name, f"{name} must be a time in epoch seconds")
    return value


def _limit(query: Mapping[str, str]) -> int:
    raw = query.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.isascii() or not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise _invalid("limit", f"limit must be an integer from 1 to {MAX_LIMIT}")
    return int(raw)


async def answer(app: web.Application, query: UsageQuery) -> dict[str, object]:
    """The usage document of S4.5 (also what the console charts)."""
    store = app[appkeys.usage_key]
    hours = query.range.hours(app[appkeys.clock_key].now_ms(), app[appkeys.config_key].runs_retention_ms)
    if query.key is not None:
        return {"object": "usage", "key": query.key, "data": await key_buckets(store, query.key, hours, query.bucket)}
    ranked = await top_keys(store, hours, query.limit)
    return {"object": "usage", "data": [{"key": item.key, **record(item.counters)} for item in ranked]}


async def get_usage(request: web.Request) -> web.Response:
    now_s = request.app[appkeys.clock_key].now_ms() / 1000
    return json_response(await answer(request.app, UsageQuery.parse(request.query, now_s)))


def register(app: web.Application) -> None:
    app.router.add_get("/v1/usage", get_usage)
