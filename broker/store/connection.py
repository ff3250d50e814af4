"""Redis clients: one pooled client per replica, replies decoded to str; a cluster client with REDIS_CLUSTER.

The rest of the broker types its client as `Redis`: redis-py's asyncio `RedisCluster` offers the same
commands, scripts (routed by their first key) and pipelines (split per node), and follows MOVED/ASK and
failovers itself. The few places that differ ask `is_cluster`.
"""

from __future__ import annotations

import socket
import sys
from typing import cast

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

from broker.store.pool import HiredisPackingConnection, LeanBlockingPool

#: Commands wait for one of these (a round trip is ~0.1 ms); blocking reads (the claim loop, the board
#: outbox) and the nudge subscription hold one each. 8 + the SSE hub's reader keep a replica within the 10
#: Redis connections however many SSE clients it serves (bench: the same create and end-to-end figures as 32).
MAX_CONNECTIONS = 8
CLUSTER_MAX_CONNECTIONS = 512  #: per node
POOL_WAIT_S = 10
#: TCP keepalive of the single-Redis client: a peer that vanished is noticed after about 5 + 3 * 2 s.
KEEPALIVE: dict[int, int | bytes] = (
    {socket.TCP_KEEPIDLE: 5, socket.TCP_KEEPINTVL: 2, socket.TCP_KEEPCNT: 3} if sys.platform == "linux" else {}
)
#: RESP2 on a single Redis: redis-py 8 made RESP3 its default, which costs about a fifth more broker CPU per
#: job (bench e2e, redis-py 8.1: 14.3 vs 11.8 s for 2,000 jobs). The cluster client keeps the default: redis-py
#: 8.1's cluster MULTI fails under RESP2 (its RESP2 reply callbacks do not take the `keys` it passes them).
PROTOCOL = 2


def connect(url: str, *, max_connections: int = MAX_CONNECTIONS, cluster: bool = False) -> Redis:
    """A bounded client: past `max_connections` a command waits for a free connection instead of
    failing (redis-py's default pool raises, STYLE A.8 #1), and a command is retried through a
    brief disconnect (Redis restart, failover)."""
    if cluster:
        # redis-py's cluster pools do not wait for a free connection (they raise), so each node's pool is
        # large enough for every concurrent command plus one SSE reader per partition
        client = RedisCluster.from_url(
            url,
            decode_responses=True,
            max_connections=CLUSTER_MAX_CONNECTIONS,
            socket_connect_timeout=5,
            retry=Retry(ExponentialBackoff(cap=2, base=0.05), retries=12),
        )
        return cast(Redis, client)
    pool = LeanBlockingPool.from_url(
        url,
        connection_class=HiredisPackingConnection,  # rediss:// and unix:// keep redis-py's own (from_url)
        decode_responses=True,
        protocol=PROTOCOL,
        max_connections=max_connections,
        timeout=POOL_WAIT_S,
        health_check_interval=30,
        socket_connect_timeout=5,
        socket_timeout=None,  # see broker/store/pool.py: keepalive notices a Redis that vanished
        socket_keepalive=True,
        socket_keepalive_options=KEEPALIVE,
        retry=Retry(ExponentialBackoff(cap=2, base=0.05), retries=8),
        retry_on_error=[ConnectionError, TimeoutError],
    )
    return Redis.from_pool(pool)  # the client owns the pool: aclose() disconnects it


def is_cluster(redis: object) -> bool:
    return isinstance(redis, RedisCluster)


async def cluster_state(redis: Redis) -> dict[str, object]:
    """What /readyz shows of a cluster: its state as one node sees it, and the masters this client knows."""
    cluster = cast(RedisCluster, redis)
    info = cast(dict[str, object], await cluster.cluster_info(target_nodes=RedisCluster.RANDOM))
    masters = sorted(f"{node.host}:{node.port}" for node in cluster.get_primaries())
    return {
        "state": str(info.get("cluster_state", "unknown")),
        "slots_ok": int(cast(int, info.get("cluster_slots_ok", 0))),
        "known_nodes": int(cast(int, info.get("cluster_known_nodes", 0))),
        "masters": masters,
    }
