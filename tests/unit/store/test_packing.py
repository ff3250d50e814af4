"""The broker's connections pack commands with hiredis: the bytes must be exactly redis-py's own."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from broker.store.connection import connect
from broker.store.pool import HiredisPackingConnection

ARG = st.one_of(
    st.text(),
    st.binary(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.binary().map(bytearray),
    st.binary().map(memoryview),
)
NAME = st.sampled_from(["EVALSHA", "XADD", "SCRIPT LOAD", b"CONFIG GET", "zadd", b"HSET"])


def packed(connection: Connection, args: tuple[object, ...]) -> bytes:
    return b"".join(bytes(chunk) for chunk in connection.pack_command(*args))  # type: ignore[arg-type]


@given(NAME, st.lists(ARG, max_size=12))
def test_hiredis_packs_every_command_as_redis_py_does(name: str | bytes, args: list[object]) -> None:
    command = (name, *args)
    assert packed(HiredisPackingConnection(), command) == packed(Connection(), command)


def test_a_value_redis_cannot_take_is_a_data_error() -> None:
    with pytest.raises(DataError):
        HiredisPackingConnection().pack_command("SET", "key", object())  # type: ignore[arg-type]


def test_the_broker_client_uses_it_on_tcp() -> None:
    client = connect("redis://127.0.0.1:1/0")
    assert client.connection_pool.connection_class is HiredisPackingConnection
