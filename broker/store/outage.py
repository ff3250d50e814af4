"""Which failures mean "Redis cannot take this write right now" (SPEC S9: a failover is a 503, never a 500).

One place decides it for every edge: the HTTP error middleware answers 503 `unavailable` with `Retry-After`,
and the driver, the board sender and the SSE hub log a warn line without a traceback and retry. Anything
else is a bug and keeps its 500 and its traceback.
"""

from __future__ import annotations

import logging
import re
import traceback
from pathlib import PurePath

from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    CrossSlotTransactionError,
    InvalidPipelineStack,
    InvalidResponse,
    OutOfMemoryError,
    ReadOnlyError,
    RedisClusterException,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from broker.errors import NotReplicated

#: Error codes a node answers while its slots move, it fails over, it loads its data or it is full (OOM: a write
#: past `maxmemory` under `noeviction`, SPEC S9 "a full Redis is an outage too"). Redis 7 keeps the code
#: first in a Lua script's error; Redis 6.2 puts it after the script's position (`… @user_script:12: -READONLY …`).
OUTAGE_CODES = ("CLUSTERDOWN", "TRYAGAIN", "MASTERDOWN", "LOADING", "READONLY", "NOREPLICAS", "MOVED", "ASK", "OOM")
_CODE = re.compile(r"(?:^|user_script:\s*\d+:\s*-?)(?:" + "|".join(OUTAGE_CODES) + r")\b")

#: Raised for calls the broker made wrong: a bug, never an outage.
_BUGS = (CrossSlotTransactionError, InvalidPipelineStack)
#: Everything a Redis call can raise (the cluster client's own errors are no RedisError), for best-effort
#: steps whose failure the schedule or a lease expiry repairs anyway.
REDIS_FAILURES: tuple[type[Exception], ...] = (RedisError, RedisClusterException, OSError)


#: Where a connection torn down under a command surfaces as a TypeError, AttributeError or RuntimeError instead of a
#: ConnectionError (redis-py 8.1 issues #4287: a write on a peer-closed transport; #3835: a node gone from the
#: cluster client's topology). Seen here in failovers: "'NoneType' object has no attribute 'writelines'" (redis-py's
#: connection) and "unable to perform operation on <TCPTransport closed=True …>; the handler is closed" (uvloop).
_TRANSPORTS = (("asyncio", "selector_events.py"), ("asyncio", "streams.py"), ("asyncio", "sslproto.py"))
_REDIS_IO = ("connection.py", "cluster.py")


def _torn_down(error: BaseException) -> bool:
    """Raised inside a transport (asyncio's, uvloop's) or redis-py's connection and cluster code."""
    frames = traceback.extract_tb(error.__traceback__)
    if not frames:
        return False
    innermost = PurePath(frames[-1].filename)
    if (innermost.parent.name, innermost.name) in _TRANSPORTS or "uvloop" in innermost.parts:
        return True
    return "redis" in innermost.parts and innermost.name in _REDIS_IO


def is_outage(error: BaseException) -> bool:
    """True when `error` means the Redis slot a call needed was unreachable or not writable for a while
    (connection lost or refused, a timeout, a failover: CLUSTERDOWN, TRYAGAIN, MASTERDOWN, LOADING, a
    read-only replica, a WAIT shortfall, a topology the cluster client could not settle) or a full Redis refused a
    write (OOM)."""
    match error:
        case NotReplicated() | RedisConnectionError() | RedisTimeoutError() | OSError():
            return True  # redis-py's connection errors include BusyLoadingError (LOADING) and a full pool
        case ClusterDownError() | TryAgainError() | ReadOnlyError() | ClusterError() | AskError() | InvalidResponse():
            # also MasterDownError and MovedError; a ClusterError: the client's redirections ran out; InvalidResponse:
            # a reply cut off mid-read
            return True
        case OutOfMemoryError():
            return True  # redis-py strips the OOM code from the message of the error it names
        case RedisClusterException():
            return not isinstance(error, _BUGS)  # no node reachable, a slot not covered, no target node
        case ResponseError():
            return _CODE.search(str(error)) is not None
        case TypeError() | AttributeError() | RuntimeError():
            return _torn_down(error)
    return False


def log_failure(log: logging.Logger, error: BaseException, *, outage: str, bug: str, **extra: object) -> None:
    """The one line a guard writes for what it caught: an outage (expected, retried) at warn without a traceback,
    anything else (a bug) at error with it."""
    if is_outage(error):
        log.warning(outage, extra={**extra, "error": outage_name(error)})
    else:
        log.error(bug, exc_info=error, extra={**extra, "error": repr(error)})


def outage_name(error: BaseException) -> str:
    """What a log line says of an outage: the exception's class and the start of its message."""
    message = str(error)
    return f"{type(error).__name__}: {message[:200]}" if message else type(error).__name__
