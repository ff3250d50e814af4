"""DESIGN invariant 7: for any reconnect sequence, across replicas, a client sees the stream in order, once."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.http.test_sse_support import Client, append, completed, create_job, delta, open_stream

pytestmark = BOTH_BACKENDS

#: One connection: (events the driver appends while it is open, frames read before it drops, replica, use header)
steps = st.tuples(st.integers(0, 4), st.integers(0, 6), st.integers(0, 1), st.booleans())


@pytest.fixture
async def replicas(make_client: ClientFactory) -> tuple[Client, Client]:
    return await make_client(), await make_client()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=st.lists(steps, min_size=1, max_size=5))
async def test_any_sequence_of_disconnects_sees_every_event_once(
    replicas: tuple[Client, Client], redis: Redis, plan: list[tuple[int, int, int, bool]]
) -> None:
    job = await create_job(replicas[0])
    expected = [frame.id for frame in await (await open_stream(replicas[0], job)).frames(1)]  # job.queued
    seen: list[str] = []
    for appends, reads, replica, by_header in plan:
        # Given a client (re)connecting with its last id, to either replica, by header or by query
        reader = await open_stream(replicas[replica], job, **_resume(seen[-1] if seen else None, by_header))
        # When the driver appends while it follows, and the connection drops after some frames
        for n in range(appends):
            expected += await append(redis, job, [delta(job, str(n))])
        seen += [frame.id for frame in await reader.frames(min(reads, len(expected) - len(seen)))]
        reader.response.close()
    final = await open_stream(replicas[plan[-1][2]], job, **_resume(seen[-1] if seen else None, True))
    expected += await append(redis, job, [completed(job)])
    seen += [frame.id for frame in await final.frames()]
    # Then what it saw, concatenated, is the stream's shown events, in order, once
    assert seen == expected


def _resume(last: str | None, by_header: bool) -> dict[str, dict[str, str]]:
    if last is None:
        return {}
    return {"headers": {"Last-Event-ID": last}} if by_header else {"params": {"after": last}}
