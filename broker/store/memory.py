"""How full Redis is: `INFO memory` of the single Redis, or of every master of a cluster (SPEC S4.4).

One INFO per node per call: the memory watch calls it about once a second per replica, never per request.
"""

from __future__ import annotations

from typing import cast

from attrs import frozen
from redis.asyncio import Redis, RedisCluster

from broker.store.connection import is_cluster


@frozen
class NodeMemory:
    """One node's `used_memory` and `maxmemory` in bytes (`maxmemory` 0: no limit)."""

    node: str
    used: int
    maxmemory: int


async def node_memory(redis: Redis) -> list[NodeMemory]:
    """Every node that takes writes: the single Redis, or each master of a cluster."""
    if not is_cluster(redis):
        return [_reading("redis", await redis.info("memory"))]
    cluster = cast(RedisCluster, redis)
    readings = []
    for node in cluster.get_primaries():
        info = await cluster.info("memory", target_nodes=node)
        readings.append(_reading(f"{node.host}:{node.port}", info))
    return readings


def _reading(node: str, info: object) -> NodeMemory:
    fields = cast(dict[str, object], info)
    return NodeMemory(node, int(cast(int, fields.get("used_memory", 0))), int(cast(int, fields.get("maxmemory", 0))))
