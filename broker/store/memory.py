"""How full Redis is: `INFO memory` of the single Redis, or of every master of a cluster, and how many jobs on
each have not ended yet (the size of its partitions' due schedules, which hold every unfinished job) (SPEC S4.4).

The memory watch calls `node_memory` about once a second per replica, never per request: on a single Redis one
INFO, and while a `maxmemory` is set one pipeline of a ZCARD per partition.
"""

from __future__ import annotations

from typing import cast

from attrs import frozen
from redis.asyncio import Redis, RedisCluster

from broker.store import keys
from broker.store.connection import is_cluster


@frozen
class NodeMemory:
    """One node's `used_memory` and `maxmemory` in bytes (`maxmemory` 0: no limit), and its unfinished jobs (read
    only when it has a maxmemory)."""

    node: str
    used: int
    maxmemory: int
    unfinished: int = 0


async def node_memory(redis: Redis) -> list[NodeMemory]:
    """Every node that takes writes: the single Redis, or each master of a cluster."""
    if not is_cluster(redis):
        reading = _reading("redis", await redis.info("memory"))
        if not reading.maxmemory:
            return [reading]
        counts = await _unfinished(redis)
        return [NodeMemory(reading.node, reading.used, reading.maxmemory, sum(counts.values()))]
    cluster = await cast(RedisCluster, redis).initialize()  # a no-op once the client knows the topology
    readings = [
        _reading(_name(node.host, node.port), await cluster.info("memory", target_nodes=node))
        for node in cluster.get_primaries()
    ]
    if not any(reading.maxmemory for reading in readings):
        return readings
    counts = await _unfinished(redis)
    by_node: dict[str, int] = {}
    for partition, count in counts.items():
        node = cluster.get_node_from_key(keys.due(partition))
        if node is not None:  # else a slot the client no longer maps: its jobs count on no node until it does
            name = _name(node.host, node.port)
            by_node[name] = by_node.get(name, 0) + count
    return [NodeMemory(r.node, r.used, r.maxmemory, by_node.get(r.node, 0)) for r in readings]


async def _unfinished(redis: Redis) -> dict[int, int]:
    """Jobs not ended, per partition: one pipeline (split per node on a cluster)."""
    async with redis.pipeline(transaction=False) as pipe:
        for partition in keys.partitions():
            pipe.zcard(keys.due(partition))
        counts = await pipe.execute()
    return {partition: int(count) for partition, count in zip(keys.partitions(), counts, strict=True)}


def _name(host: str, port: int | str) -> str:
    return f"{host}:{port}"


def _reading(node: str, info: object) -> NodeMemory:
    fields = cast(dict[str, object], info)
    return NodeMemory(node, int(cast(int, fields.get("used_memory", 0))), int(cast(int, fields.get("maxmemory", 0))))
