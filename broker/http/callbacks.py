"""The `callback` member of job objects (SPEC S5.8): read for the jobs that have one, in one round trip."""

from __future__ import annotations

from collections.abc import Sequence

from aiohttp import web

from broker.http import appkeys
from projections.job import JobView


async def callback_documents(app: web.Application, views: Sequence[JobView]) -> dict[str, dict[str, object]]:
    """`{"url", "status", "attempts", "last_error"}` per job id of the views that have a callback."""
    jobs = [(view.job_id, view.callback_url) for view in views if view.callback_url is not None]
    if not jobs:
        return {}
    states = await app[appkeys.callbacks_key].states(jobs)
    return {job_id: state.document() for job_id, state in states.items()}
