"""STYLE C.3: `broker/store/pool.py` rides on private attributes of redis-py's asyncio BlockingConnectionPool.
pyproject bounds redis-py to the release the tests ran; when a newer one moves these internals, this test says so
plainly instead of the pool leaking or double-handing connections at run time."""

from __future__ import annotations

import inspect

from redis.asyncio import BlockingConnectionPool
from redis.asyncio.connection import AbstractConnection, Connection

MOVED = "redis-py changed the BlockingConnectionPool internals broker/store/pool.py relies on: {}; update pool.py"


def test_the_pool_internals_the_lean_pool_relies_on_are_still_there() -> None:
    pool = BlockingConnectionPool(connection_class=Connection, max_connections=2, timeout=1)
    assert isinstance(getattr(pool, "_available_connections", None), list), MOVED.format("_available_connections")
    assert isinstance(getattr(pool, "_in_use_connections", None), set), MOVED.format("_in_use_connections")
    for name in ("max_connections", "timeout"):
        assert hasattr(pool, name), MOVED.format(name)
    assert callable(getattr(pool, "make_connection", None)), MOVED.format("make_connection")
    for name in ("get_connection", "release"):  # the methods pool.py overrides, called by the client
        assert inspect.iscoroutinefunction(getattr(BlockingConnectionPool, name)), MOVED.format(name)
    for name in ("connect", "disconnect", "should_reconnect", "pack_command"):  # what pool.py calls on connections
        assert callable(getattr(AbstractConnection, name, None)), MOVED.format(f"AbstractConnection.{name}")
