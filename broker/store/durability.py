"""REDIS_WAIT_REPLICAS (SPEC S9): a write is acknowledged only once that many replicas have it.

`WAIT n timeout` counts the replicas that acknowledged every write of the connection it is sent on, so it
goes on the connection of the write: in one pipeline with the script on a single Redis, and to the node
that owns the script's slot on a cluster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from attrs import frozen
from redis.asyncio import Redis, RedisCluster
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

from broker.errors import NotReplicated


@frozen
class Durability:
    replicas: int = 0  #: REDIS_WAIT_REPLICAS; 0 = acknowledge what the master has
    timeout_ms: int = 1_000  #: REDIS_WAIT_TIMEOUT

    def check(self, acknowledged: int) -> None:
        if acknowledged < self.replicas:
            raise NotReplicated(acknowledged, self.replicas)


async def replicated(
    redis: Redis,
    script: AsyncScript,
    keys: Sequence[str],
    args: Sequence[str | bytes | int | float],
    durability: Durability,
) -> object:
    """Run `script` and WAIT on the cluster node that owns its slot (one connection, one round trip)."""
    cluster = cast(RedisCluster, redis)
    await cluster.initialize()  # a no-op once the client knows the slots
    node = cluster.get_node_from_key(keys[0])
    for _ in range(2):
        async with redis.pipeline(transaction=False) as pipe:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            pipe.execute_command("WAIT", durability.replicas, durability.timeout_ms, target_nodes=node)
            first, acknowledged = await pipe.execute(raise_on_error=False)
        if isinstance(first, NoScriptError):
            await redis.script_load(script.script)
            continue
        if isinstance(first, Exception):
            raise first
        if isinstance(acknowledged, Exception):
            # The write ran (after a MOVED, maybe on another node), but its WAIT found no master there ("WAIT
            # cannot be used with replica instances" on a node a failover demoted): not confirmed in time.
            raise NotReplicated(0, durability.replicas) from acknowledged
        durability.check(int(acknowledged))
        return first
    raise NoScriptError("the script could not be loaded")
