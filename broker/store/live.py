"""The live reader: one dedicated connection running `XREAD BLOCK` over many job streams at once.

The event hub holds one per replica (one per partition with subscribers on a cluster), so SSE never needs a
connection per client (STYLE A.8 #1). A blocked read is woken by `CLIENT UNBLOCK` from the pooled client
when the set of streams changes. On a cluster the reader's connection is one of the pool of the node that
owns its slot (`route`, a key of the slot), re-picked after every error, so it follows a failover (the
cluster client re-reads the topology when its own commands fail).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextlib import suppress
from typing import cast

from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.asyncio.connection import AbstractConnection, Connection
from redis.exceptions import RedisClusterException, RedisError, ResponseError

from broker.events import JobEvent
from broker.store import keys
from broker.store.entries import Entries as EntryReader

Entries = list[tuple[str, JobEvent]]


class UnblockRefused(Exception):
    """Raised when Redis refuses CLIENT UNBLOCK (e.g. NOPERM under an ACL): readers must block briefly."""


class LiveReader:
    def __init__(self, redis: Redis, *, route: str | None = None) -> None:
        self._redis = redis
        self._route = route  #: on a cluster: a key of the slot every stream read here lives in
        self._entries = EntryReader(redis)
        self._node: ClusterNode | None = None
        self._connection: AbstractConnection | None = None
        self.client_id: int | None = None  #: CLIENT ID of the reader's connection (None while disconnected)

    async def read(self, cursors: Sequence[tuple[str, str]], *, count: int, block_ms: int) -> list[tuple[str, Entries]]:
        """Entries after each `(job id, cursor)`, waiting up to `block_ms` for the first; [] on timeout or unblock."""
        connection = await self._connect()
        streams = [keys.events(job_id) for job_id, _ in cursors]
        await connection.send_command(
            "XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", *streams, *(cursor for _, cursor in cursors)
        )
        reply = await connection.read_response(timeout=block_ms / 1000 + 10)
        read = []
        for key, raw in _stream_entries(reply):
            job_id = keys.job_id_of(key) or ""
            read.append((job_id, await self._entries.events(job_id, raw)))
        return read

    async def unblock(self) -> bool:
        """Wake a blocked read; False when none was blocked (yet). Raises UnblockRefused."""
        if self.client_id is None:
            return False
        try:
            if self._node is not None:
                return bool(await self._redis.client_unblock(self.client_id, target_nodes=self._node))
            return bool(await self._redis.client_unblock(self.client_id))
        except ResponseError as error:
            raise UnblockRefused(str(error)) from None

    async def drop(self) -> None:
        """Forget the connection after an error; the next read reconnects (on a cluster: to the node that
        owns the slot then, after a refresh of the topology)."""
        self.client_id = None
        if self._connection is not None:
            with suppress(RedisError, OSError):
                await self._connection.disconnect()
        if self._node is not None:
            await self.close()  # the next read asks the client for the slot's node (it follows failovers)

    async def close(self) -> None:
        connection, self._connection = self._connection, None
        node, self._node = self._node, None
        self.client_id = None
        if connection is not None:
            with suppress(RedisError, OSError):
                await connection.disconnect()
            if node is not None:
                node.release(cast(Connection, connection))
            else:
                await self._redis.connection_pool.release(connection)

    async def _connect(self) -> AbstractConnection:
        """One connection of the app's pool (of the slot's node), held for the reader's lifetime."""
        if self._connection is None and self._route is not None:
            cluster = cast(RedisCluster, self._redis)
            await cluster.initialize()  # a no-op once the client knows the slots
            node = cluster.get_node_from_key(self._route)
            if node is None:
                raise RedisClusterException(f"no node serves {self._route}")
            self._node, self._connection = node, node.acquire_connection()
        if self._connection is None:
            # redis-py leaves these two untyped
            get_connection = cast(
                Callable[[], Awaitable[AbstractConnection]], self._redis.connection_pool.get_connection
            )
            self._connection = await get_connection()
        if not self._connection.is_connected or self.client_id is None:
            await cast(Callable[[], Awaitable[None]], self._connection.connect)()
            await self._connection.send_command("CLIENT", "ID")
            self.client_id = int(cast(int, await self._connection.read_response()))
        return self._connection


def _stream_entries(reply: object) -> list[tuple[str, list[tuple[str, dict[str, str]]]]]:
    """Narrow a raw XREAD reply (RESP2 list or RESP3 map; None on timeout or unblock)."""
    if reply is None:
        return []
    streams = list(reply.items()) if isinstance(reply, dict) else cast(list[list[object]], reply)
    result: list[tuple[str, list[tuple[str, dict[str, str]]]]] = []
    for key, raw_entries in streams:
        entries = []
        for entry_id, raw_fields in cast(list[tuple[str, list[str] | None]], raw_entries):
            flat = raw_fields or []
            entries.append((str(entry_id), dict(zip(flat[::2], flat[1::2], strict=True))))
        result.append((str(key), entries))
    return result
