"""Redis clients: one pooled client per replica, replies decoded to str."""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

#: Commands wait for one of these (a round trip is ~0.1 ms); blocking reads (the claim loop, the board
#: outbox) and the nudge subscription hold one each. 8 + the SSE hub's reader keep a replica within the 10
#: Redis connections however many SSE clients it serves (bench: the same create and end-to-end figures as 32).
MAX_CONNECTIONS = 8
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
