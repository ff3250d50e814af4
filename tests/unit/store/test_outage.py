"""One place says which failures are a Redis outage (SPEC S9: a failover is a 503, never a 500)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import (
    AskError,
    AuthenticationError,
    BusyLoadingError,
    ClusterDownError,
    ClusterError,
    CrossSlotTransactionError,
    DataError,
    InvalidPipelineStack,
    InvalidResponse,
    MasterDownError,
    MaxConnectionsError,
    MovedError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
    WatchError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker.errors import Busy, InvalidRequest, NotReplicated
from broker.store.outage import is_outage, log_failure, outage_name

#: Every failure a Redis call can end in, and whether it means "this slot is not writable right now".
TABLE: list[tuple[BaseException, bool]] = [
    (RedisConnectionError("Error 111 connecting to 127.0.0.1:7000. Connection refused."), True),
    (RedisTimeoutError("Timeout reading from socket"), True),
    (MaxConnectionsError("Too many connections"), True),
    (BusyLoadingError("Redis is loading the dataset in memory"), True),
    (AuthenticationError("invalid password"), True),  # a connection error: a node restarted without its config
    (ClusterDownError("The cluster is down"), True),
    (MasterDownError("Link with MASTER is down and replica-serve-stale-data is set to 'no'."), True),
    (TryAgainError("Multiple keys request during rehashing of slot"), True),
    (ReadOnlyError("You can't write against a read only replica."), True),
    (ClusterError("TTL exhausted."), True),
    (InvalidResponse("Protocol Error: b'*'"), True),  # a reply cut off mid-read
    (MovedError("3999 127.0.0.1:6381"), True),  # redirections the client gave up following
    (AskError("3999 127.0.0.1:6381"), True),
    (SlotNotCoveredError('Slot "3999" is not covered by the cluster.'), True),
    (RedisClusterException("Redis Cluster cannot be connected. Please provide at least one reachable node"), True),
    (NotReplicated(0, 1), True),  # a WAIT shortfall
    (ConnectionResetError(104, "Connection reset by peer"), True),
    (OSError(113, "No route to host"), True),
    (TimeoutError(), True),
    (ResponseError("LOADING Redis is loading the dataset in memory"), True),  # inside a pipeline: not parsed
    (ResponseError("CLUSTERDOWN The cluster is down"), True),
    (ResponseError("TRYAGAIN Multiple keys request during rehashing of slot"), True),
    (ResponseError("MASTERDOWN Link with MASTER is down"), True),
    (ResponseError("NOREPLICAS Not enough good replicas to write."), True),
    (ResponseError("READONLY You can't write against a read only replica. script: 3f2a, on @user_script:31."), True),
    (ResponseError("ERR Error running script (call to f_3f2a): @user_script:31: -READONLY You can't write"), True),
    # a full Redis under noeviction (SPEC S9): as a command, in a pipeline, inside a script on Redis 7 and 6.2
    (OutOfMemoryError("command not allowed when used memory > 'maxmemory'."), True),
    (OutOfMemoryError('Command # 1 (SET z 1) of pipeline caused error: ("command not allowed",)'), True),
    (ResponseError("OOM command not allowed when used memory > 'maxmemory'."), True),
    (ResponseError("OOM command not allowed when used memory > 'maxmemory'. script: 55b2, on @user_script:1."), True),
    (ResponseError("Error running script (call to f_55b2): @user_script:1: @user_script: 1: -OOM command not"), True),
    # bugs: they keep their 500 and their traceback
    (ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"), False),
    (ResponseError("ERR Error running script (call to f_3f2a): @user_script:12: user_script:12: bad argument"), False),
    (ResponseError("ERR unknown command 'XADDD'"), False),
    (NoScriptError("No matching script. Please use EVAL."), False),
    (DataError("Invalid input of type: 'NoneType'."), False),
    (WatchError("Watched variable changed."), False),
    (CrossSlotTransactionError("All keys involved in a cluster transaction must map to the same slot"), False),
    (InvalidPipelineStack("pipeline stack is corrupted"), False),
    (InvalidRequest("invalid_json", "Request body must be a JSON object."), False),
    (Busy("The job kept changing; try again"), False),  # a 503 of its own, not an outage
    (ValueError("not a Redis error"), False),
    (KeyError("state"), False),
]


@pytest.mark.parametrize(("error", "outage"), TABLE, ids=lambda value: type(value).__name__)
def test_each_failure_is_classified(error: BaseException, outage: bool) -> None:
    assert is_outage(error) is outage


def test_an_outage_is_named_by_its_class_and_message() -> None:
    assert outage_name(ClusterDownError("The cluster is down")) == "ClusterDownError: The cluster is down"
    assert outage_name(TimeoutError()) == "TimeoutError"
    assert len(outage_name(RedisConnectionError("x" * 1000))) < 240


async def _raised(call: Callable[[], Awaitable[object]]) -> BaseException:
    try:
        await call()
    except Exception as error:
        return error
    raise AssertionError("the call raised nothing")


async def test_a_connection_torn_down_under_a_command_is_an_outage() -> None:
    # redis-py 8.1 surfaces a connection closed under a write as an AttributeError/TypeError from its connection
    # code or the transport (redis-py #4287), e.g. "'NoneType' object has no attribute 'writelines'"
    torn = Connection()  # never connected: its writer is None, as after a teardown by another task
    error = await _raised(lambda: torn._send_packed_command([b"PING\r\n"]))
    assert isinstance(error, AttributeError) and is_outage(error)


def test_a_closed_transport_under_a_write_is_an_outage() -> None:
    # uvloop's form of the same race, raised from the transport under redis-py's write (seen in a failover): the
    # error is rebuilt here with uvloop's file name, as a closed uvloop transport is hard to catch mid-write
    source = (
        "def writelines(data):\n    raise RuntimeError('unable to perform operation on <TCPTransport closed=True>')\n"
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, "uvloop/handles/stream.pyx", "exec"), namespace)
    try:
        namespace["writelines"]([b"PING\r\n"])
    except RuntimeError as error:
        assert is_outage(error)
    else:
        raise AssertionError("nothing raised")


async def test_our_own_attribute_and_type_errors_stay_bugs() -> None:
    async def ours() -> object:
        return cast(Any, None).writelines([b"x"])

    async def wrong_type() -> object:
        return len(cast(Any, 5))

    assert not is_outage(await _raised(ours))
    assert not is_outage(await _raised(wrong_type))
    assert not is_outage(AttributeError("no traceback"))
    assert not is_outage(RuntimeError("Event loop is closed"))


def test_a_guard_logs_an_outage_as_a_warning_and_a_bug_with_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("tests.outage.Guard")
    with caplog.at_level(logging.WARNING, logger="tests.outage"):
        log_failure(log, ClusterDownError("The cluster is down"), outage="Lost Redis.", bug="Failed.", job="job_1")
        try:
            raise KeyError("state")
        except KeyError as error:
            log_failure(log, error, outage="Lost Redis.", bug="Failed.", job="job_1")
    warned, failed = caplog.records
    assert (warned.levelname, warned.message, warned.exc_info) == ("WARNING", "Lost Redis.", None)
    assert warned.__dict__["error"] == "ClusterDownError: The cluster is down" and warned.__dict__["job"] == "job_1"
    assert (failed.levelname, failed.message) == ("ERROR", "Failed.") and failed.exc_info is not None
