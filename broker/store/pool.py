"""The single-Redis client's connections and pool, without redis-py 8's per-command costs.

redis-py's asyncio client spends more CPU per command than the broker spends deciding what to write
(a script call cost ~150 us of CPU here; the same call through these classes ~55 us, bench notes in
issue 11). Three costs are avoidable without leaving redis-py:
  - it packs commands in Python; hiredis packs the same bytes in C (redis-py's sync client uses it);
  - its blocking pool takes a condition, a timeout, a health poll of the socket and two observability
    hooks per checkout and return; here both are a few list operations, and a caller waiting for a
    connection gets the next one returned (a busy replica waits for its 8 connections all the time);
  - a socket timeout makes every send a task (`asyncio.wait_for`): `connect` sets none and keeps TCP
    keepalive instead (a Redis that vanished is noticed in about 11 s; one that restarts at once).
A command cancelled between its send and its reply disconnects its connection (redis-py does that in
`read_response`), so a connection handed back here never holds an unread reply.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import hiredis
from redis.asyncio import BlockingConnectionPool
from redis.asyncio.connection import AbstractConnection, Connection
from redis.exceptions import ConnectionError, DataError
from redis.typing import EncodableT

_BUFFERS = (bytearray, memoryview)


class HiredisPackingConnection(Connection):
    """A TCP connection that packs commands with hiredis; the bytes are redis-py's own
    (tests/unit/store/test_packing.py)."""

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        first = args[0]
        if isinstance(first, str):  # a command name of several words ("SCRIPT LOAD") goes as several args
            args = (*first.encode().split(), *args[1:])
        elif isinstance(first, bytes) and b" " in first:
            args = (*first.split(), *args[1:])
        try:
            return [hiredis.pack_command(args)]  # type: ignore[arg-type]  # its stub types a 1-tuple
        except TypeError:  # it takes str, int, float and bytes: other buffers go as their bytes
            flat = tuple(bytes(arg) if isinstance(arg, _BUFFERS) else arg for arg in args)
        try:
            return [hiredis.pack_command(flat)]  # type: ignore[arg-type]
        except TypeError as error:
            raise DataError(str(error)) from error


class LeanBlockingPool(BlockingConnectionPool):
    """A BlockingConnectionPool whose checkout and return are a few list operations: an idle connection
    is handed out as it is (reconnected first if it dropped), a new one is made below `max_connections`,
    and past that a caller waits in line for the next connection returned, which is handed to it
    directly (first come, first served; `timeout` seconds at most, as the pool's own path)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waiting: deque[asyncio.Future[AbstractConnection]] = deque()

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> AbstractConnection:
        if self._available_connections:
            connection = self._available_connections.pop()
        elif len(self._in_use_connections) < self.max_connections:
            connection = self.make_connection()  # type: ignore[no-untyped-call]  # untyped in redis-py
        else:
            return await self._wait_for_one()
        self._in_use_connections.add(connection)
        return await self._connected(connection)

    async def _wait_for_one(self) -> AbstractConnection:
        handed: asyncio.Future[AbstractConnection] = asyncio.get_running_loop().create_future()
        self._waiting.append(handed)
        try:
            async with asyncio.timeout(self.timeout):
                connection = await handed
        except BaseException as error:
            if handed.done() and not handed.cancelled():  # handed over as the wait ended: give it on
                await self.release(handed.result())
            if isinstance(error, TimeoutError):
                raise ConnectionError("No connection available.") from error
            raise
        return await self._connected(connection)

    async def _connected(self, connection: AbstractConnection) -> AbstractConnection:
        try:
            await connection.connect()  # type: ignore[no-untyped-call]  # a no-op while connected
        except BaseException:
            await self.release(connection)
            raise
        return connection

    async def release(self, connection: AbstractConnection) -> None:
        if connection.should_reconnect():  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            await connection.disconnect()
        while self._waiting:
            handed = self._waiting.popleft()
            if not handed.done():
                handed.set_result(connection)  # still in use: now by the waiter
                return
        self._in_use_connections.discard(connection)
        self._available_connections.append(connection)
