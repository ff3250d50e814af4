"""Script calls of one replica made in the same turn of the event loop go out together, in one pipeline.

A busy replica writes for many jobs at once (creates, appends of the runners); each call on its own costs
a send and a read of its own (about 130 us of broker CPU per call against about 20 in a pipeline of 32). A call
made while nothing else is on its way goes at once, alone (a quiet replica adds no wait to a write); the calls
made while a batch (or a lone call) is on its way make up the next batch, which leaves as soon as that one has its
replies: no call waits for a timer, and batches reach Redis one after another (two on two connections could
arrive in either order, and a create takes its place in the line in its write: creates keep the order they were
made in). The calls of a batch keep their order; each gets its own reply or error (a script's error fails only
its call). Only on a single Redis without WAIT: a cluster pipeline splits by node anyway, and a WAIT belongs to
the write it follows.

A batch (or a lone call) is one write of the EVALSHAs packed together and a read of their replies on one pooled
connection: redis-py's pipeline (a command stack, its packing, a callback lookup and an error check per reply)
and its script call (a command dict, an options dict and a retry wrapper per call) cost more than the write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from attrs import define
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from broker.store.connection import is_cluster
from broker.store.scripts import Args


@define
class _Call:
    script: AsyncScript
    keys: Sequence[str]
    args: Args
    reply: asyncio.Future[object]


class ScriptBatch:
    """The script calls of one loop turn, sent in one pipeline."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._cluster = is_cluster(redis)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[_Call] = []
        self._sending: set[asyncio.Task[None]] = set()  #: strong references to the batches on their way
        self._alone = 0  #: calls on their way alone (1 or 0): a call made meanwhile joins the next turn's batch
        self._turn = asyncio.Lock()  #: held by the batch (or lone call) on its way: the next waits for its replies

    async def run(self, script: AsyncScript, keys: Sequence[str], args: Args) -> object:
        """The reply of `script` over `keys` and `args` (its error raised), sent with the turn's other calls."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # calls left on a loop that stopped before they ended are no one's
            self._loop, self._pending, self._sending, self._alone = loop, [], set(), 0
            self._turn = asyncio.Lock()
        if not self._pending and not self._sending and not self._alone:  # nothing on its way: go at once, alone
            self._alone += 1
            try:
                async with self._turn:
                    (alone,) = await self._replies([(script, keys, args)])
            finally:
                self._alone -= 1
            if isinstance(alone, BaseException):
                raise alone
            return alone
        reply: asyncio.Future[object] = loop.create_future()
        self._pending.append(_Call(script, keys, args, reply))
        if len(self._pending) == 1:  # the first call since a batch left: its batch leaves when the one before is back
            task = asyncio.create_task(self._send())
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        return await reply

    async def _send(self) -> None:
        async with self._turn:
            calls, self._pending = self._pending, []  # every call made while the batch before was on its way
            await self._send_calls(calls)

    async def _send_calls(self, calls: list[_Call]) -> None:
        try:
            replies = await self._replies([(call.script, call.keys, call.args) for call in calls])
            for call, reply in zip(calls, replies, strict=True):
                _settle(call, reply)
        except asyncio.CancelledError:
            for call in calls:
                call.reply.cancel()
            raise
        except Exception as error:  # the connection failed: every call of the batch failed with it
            for call in calls:
                _settle(call, error)

    async def _replies(self, calls: Sequence[tuple[AsyncScript, Sequence[str], Args]]) -> list[object]:
        """Each call's reply or error, in order; a Redis that forgot a script has it loaded and the calls that
        needed it sent again (once)."""
        replies: list[object] = await self._pipelined([(script.sha, keys, args) for script, keys, args in calls])
        missing = [index for index, reply in enumerate(replies) if isinstance(reply, NoScriptError)]
        if missing:  # a restarted Redis: load the scripts and send those calls again
            for script in {id(calls[index][0]): calls[index][0] for index in missing}.values():
                await self._redis.script_load(script.script)
            again = await self._pipelined([(calls[index][0].sha, *calls[index][1:]) for index in missing])
            for index, reply in zip(missing, again, strict=True):
                replies[index] = (
                    NoScriptError("the script could not be loaded") if isinstance(reply, NoScriptError) else reply
                )
        return replies

    async def _pipelined(self, calls: Sequence[tuple[str, Sequence[str], Args]]) -> list[object]:
        """EVALSHA each (sha, keys, args) in one write on one connection; a script's error is its reply."""
        if self._cluster:  # not the broker's use (a cluster pipeline splits by node): one call after another
            return [await self._one(*call) for call in calls]
        pool = self._redis.connection_pool
        connection: AbstractConnection = await pool.get_connection()  # type: ignore[no-untyped-call]  # redis-py
        try:
            packed = [
                part
                for sha, keys, args in calls
                for part in connection.pack_command("EVALSHA", sha, len(keys), *keys, *args)
            ]
            # retried through a brief disconnect (a Redis restart), as redis-py's own calls are (connect())
            return await connection.retry.call_with_retry(
                lambda: _exchange(connection, packed, len(calls)), lambda _: connection.disconnect()
            )
        except BaseException:
            await connection.disconnect()  # replies may be left unread on it (a cancel, a lost connection)
            raise
        finally:
            await pool.release(connection)

    async def _one(self, sha: str, keys: Sequence[str], args: Args) -> object:
        try:
            return await self._redis.evalsha(sha, len(keys), *keys, *args)
        except ResponseError as error:
            return error


async def _exchange(connection: AbstractConnection, packed: list[bytes], count: int) -> list[object]:
    await connection.send_packed_command(packed, check_health=False)
    replies: list[object] = []
    for _ in range(count):
        try:
            replies.append(await connection.read_response())
        except ResponseError as error:  # an error reply is its own call's reply only
            replies.append(error)
    return replies


def _settle(call: _Call, reply: object) -> None:
    if call.reply.done():  # its caller was cancelled meanwhile
        return
    if isinstance(reply, BaseException):
        call.reply.set_exception(reply)
    else:
        call.reply.set_result(reply)
