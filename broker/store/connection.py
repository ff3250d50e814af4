"""Redis clients: one pooled client per replica, replies decoded to str."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

MAX_CONNECTIONS = 64


def connect(url: str, *, max_connections: int = MAX_CONNECTIONS) -> Redis:
    """A client that retries a command through a brief disconnect (Redis restart, failover)."""
    return Redis.from_url(
        url,
        decode_responses=True,
        max_connections=max_connections,
        health_check_interval=30,
        socket_connect_timeout=5,
        retry=Retry(ExponentialBackoff(cap=2, base=0.05), retries=8),
        retry_on_error=[ConnectionError, TimeoutError],
    )
