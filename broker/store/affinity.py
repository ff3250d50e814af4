"""Session affinity in Redis (SPEC S10): the upstream that ran a session's last job, remembered for RUNS_RETENTION.

One key per session (`keys.affinity`) with a TTL: a write touches one slot; a pass reads the sessions of the jobs
it claimed in one pipeline.
"""

from __future__ import annotations

from collections.abc import Sequence

from redis.asyncio import Redis

from broker.store import keys


class Affinity:
    def __init__(self, redis: Redis, retention_ms: int) -> None:
        self._redis = redis
        self._retention_ms = retention_ms

    async def remember(self, session_id: str, upstream: str) -> None:
        """The session's jobs go to `upstream` from now on, for RUNS_RETENTION from now."""
        await self._redis.set(keys.affinity(session_id), upstream, px=self._retention_ms)

    async def of(self, session_ids: Sequence[str]) -> dict[str, str]:
        """The remembered upstream of each of `session_ids` that has one."""
        wanted = list(dict.fromkeys(session_ids))
        if not wanted:
            return {}
        async with self._redis.pipeline(transaction=False) as pipe:
            for session_id in wanted:
                pipe.get(keys.affinity(session_id))
            replies = await pipe.execute()
        return {
            session_id: value.decode() if isinstance(value, bytes) else str(value)
            for session_id, value in zip(wanted, replies, strict=True)
            if value is not None
        }
