"""The single-Redis client's connections and pool, without redis-py 8's per-command costs.

redis-py's asyncio client spends more CPU per command than the broker spends deciding what to write
(a script call cost ~150 us of CPU here; the same call through these classes ~55 us, bench notes in
issue 11). Three costs are avoidable without leaving redis-py:
  - it packs commands in Python; hiredis packs the same bytes in C (redis-py's sync client uses it);
  - its blocking pool takes a condition, a timeout, a health poll of the socket and two observability
    hooks per checkout; an idle connected connection can be handed out and taken back directly (the
    pool's own path still serves every other case: a new connection, a wait for one, a reconnect);
  - a socket timeout makes every send a task (`asyncio.wait_for`): `connect` sets none and keeps TCP
    keepalive instead (a Redis that vanished is noticed in about 11 s; one that restarts at once).
A command cancelled between its send and its reply disconnects its connection (redis-py does that in
`read_response`), so a connection handed back here never holds an unread reply.
"""

from __future__ import annotations

from typing import Any

import hiredis
from redis.asyncio import BlockingConnectionPool
from redis.asyncio.connection import AbstractConnection, Connection
from redis.exceptions import DataError
from redis.typing import EncodableT


class HiredisPackingConnection(Connection):
    """A TCP connection that packs commands with hiredis; the bytes are redis-py's own
    (tests/unit/store/test_packing.py)."""

    def pack_command(self, *args: EncodableT) -> list[bytes]:
        first = args[0]
        if isinstance(first, str):  # a command name of several words ("SCRIPT LOAD") goes as several args
            args = (*first.encode().split(), *args[1:])
        elif isinstance(first, bytes) and b" " in first:
            args = (*first.split(), *args[1:])
        flat = tuple(bytes(arg) if isinstance(arg, bytearray | memoryview) else arg for arg in args)
        try:
            return [hiredis.pack_command(flat)]  # type: ignore[arg-type]  # its stub types a 1-tuple
        except TypeError as error:
            raise DataError(str(error)) from error


class LeanBlockingPool(BlockingConnectionPool):
    """A BlockingConnectionPool that hands out an idle connected connection, and takes one back while
    nobody waits for one, without its condition and hooks."""

    _waiters = 0  #: callers in the pool's own (waiting) path: a release must wake them

    async def get_connection(self, command_name: Any = None, *keys: Any, **options: Any) -> AbstractConnection:
        idle = self._available_connections
        if idle and idle[-1].is_connected:
            connection = idle.pop()
            self._in_use_connections.add(connection)
            return connection
        self._waiters += 1
        try:
            return await super().get_connection()  # type: ignore[no-untyped-call,no-any-return]  # untyped there
        finally:
            self._waiters -= 1

    async def release(self, connection: AbstractConnection) -> None:
        if self._waiters:
            await super().release(connection)
            return
        self._in_use_connections.remove(connection)
        if connection.should_reconnect():  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            await connection.disconnect()
        self._available_connections.append(connection)
