"""Redis clients: one pooled client per replica, replies decoded to str."""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

MAX_CONNECTIONS = 32
POOL_WAIT_S = 10


def connect(url: str, *, max_connections: int = MAX_CONNECTIONS) -> Redis:
    """A bounded client: past `max_connections` a command waits for a free connection instead of
    failing (redis-py's default pool raises, STYLE A.8 #1), and a command is retried through a
    brief disconnect (Redis restart, failover)."""
    pool = BlockingConnectionPool.from_url(
        url,
        decode_responses=True,
        max_connections=max_connections,
        timeout=POOL_WAIT_S,
        health_check_interval=30,
        socket_connect_timeout=5,
        retry=Retry(ExponentialBackoff(cap=2, base=0.05), retries=8),
        retry_on_error=[ConnectionError, TimeoutError],
    )
    return Redis.from_pool(pool)  # the client owns the pool: aclose() disconnects it
