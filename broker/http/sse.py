"""GET /v1/runs/{id}/events (SPEC S3.3): replay from stream offsets, then follow live."""

from __future__ import annotations

from aiohttp import web


def register(app: web.Application) -> None:
    """Routes and background tasks of the event stream (not built yet)."""
