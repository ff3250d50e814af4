"""Each upstream's shared health in Redis (SPEC S10; the model: broker/upstreams/health.py): the replicas' reports
merged in the upstream's admission state (`answered`, `failing`, `failed`), its one probe at a time (`probe_at`),
and the runs it still holds for jobs that moved on while it was lost (its `orphans`). Every call touches one key
of the upstream's own slot."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from redis.asyncio import Redis

from broker.store.replies import text
from broker.store.scripts import Scripts, as_strings
from broker.store.upstream_admission import UpstreamSlots
from broker.upstreams.health import Health, Heard, parse

#: How many orphaned runs one look at a returning upstream stops at most (the rest at its next look).
ORPHANS_PER_LOOK = 100


class HealthStore:
    """The shared health of the configured upstreams (the first for None or a name no longer listed)."""

    def __init__(self, redis: Redis, upstreams: Sequence[UpstreamSlots]) -> None:
        self._redis = redis
        self._scripts = Scripts(redis)
        self._upstreams = tuple(upstreams)

    def _of(self, name: str | None) -> UpstreamSlots:
        return next((u for u in self._upstreams if u.name == name), self._upstreams[0])

    async def report(self, upstream: str | None, heard: Heard) -> Health:
        """Merge one replica's record into the shared health; the health after it."""
        reply = await self._scripts.upstream_heard(
            keys=[self._of(upstream).keys.state], args=[heard.answered_ms, heard.failing_since_ms, heard.failed_ms]
        )
        return parse(*as_strings(reply))

    async def read(self, upstream: str | None) -> Health:
        read = await self._redis.hmget(self._of(upstream).keys.state, ["answered", "failing", "failed"])
        return parse(*(None if value is None else text(value) for value in read))

    async def claim_probe(self, upstream: str, now_ms: int, until_ms: int) -> bool:
        """Is this replica the one to probe the upstream now? (the next probe then goes not before `until_ms`)"""
        reply = await self._scripts.upstream_probe(keys=[self._of(upstream).keys.state], args=[now_ms, until_ms])
        return int(cast(int, reply)) == 1

    async def orphan(self, upstream: str | None, hermes_run_id: str, now_ms: int) -> None:
        """A run left on a lost upstream while its job moves on: stop it there once the upstream answers again."""
        await self._redis.zadd(self._of(upstream).keys.orphans, {hermes_run_id: now_ms})

    async def orphans(self, upstream: str) -> list[str]:
        return [text(run) for run in await self._redis.zrange(self._of(upstream).keys.orphans, 0, ORPHANS_PER_LOOK - 1)]

    async def settled(self, upstream: str, hermes_run_id: str) -> None:
        """The orphaned run was stopped (or is gone): forget it."""
        await self._redis.zrem(self._of(upstream).keys.orphans, hermes_run_id)
