"""Script calls of one replica go out pipelined on one connection: each loop turn's calls in one write, without
waiting for the replies of the writes before.

A busy replica writes for many jobs at once (creates, appends of the runners); each call on its own costs
a send and a read of its own (about 130 us of broker CPU per call against about 20 in a pipeline of 32). The calls
made in one turn of the event loop leave together in one write; the next turn's calls leave at once too, on the
same connection, while Redis still runs the ones before: Redis works on one write while the broker prepares the
next, and no call waits for a timer or for another call's reply. One connection keeps the calls in the order they
were made (a create takes its place in the line in its write: creates keep the order they were made in); a reader
hands out the replies in that order, each call its own reply or error (a script's error fails only its call).
Only on a single Redis without WAIT: a cluster pipeline splits by node anyway, and a WAIT belongs to the write it
follows.

The connection is borrowed from the client's pool while calls are on their way and handed back when the last reply
is in. A lost connection is replaced once Redis answers a PING again (redis-py's retry, with its backoff, waits out
a restart or a Redis still loading its data): the calls it had not answered are written again on the next (redis-py's
own calls are retried the same way) before any call made after them. When Redis forgot a script (a restart, SCRIPT
FLUSH), nothing more is written until the calls on their way are answered; the scripts are loaded and the calls that
needed them go again (once), in their order, ahead of the calls made meanwhile.

The write is the EVALSHAs packed together: redis-py's pipeline (a command stack, its packing, a callback lookup and
an error check per reply) and its script call (a command dict, an options dict and a retry wrapper per call) cost
more than the write.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Coroutine, Sequence

from attrs import define, field
from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import ConnectionError, NoScriptError, ResponseError

from broker.store.connection import is_cluster
from broker.store.scripts import Args, run_many

#: A call written on this many connections that were lost fails with the last one's error.
SENDS = 3


@define(eq=False)
class _Call:
    script: AsyncScript
    keys: Sequence[str]
    args: Args
    reply: asyncio.Future[object]
    sent: int = 0  #: how many times it was written
    reloaded: bool = False  #: sent again once already, after a NOSCRIPT


@define(eq=False)
class _Link:
    """A borrowed connection and the calls written on it whose replies are not in yet, oldest first."""

    connection: AbstractConnection
    unanswered: deque[_Call] = field(factory=deque)
    reader: asyncio.Task[None] | None = None
    lost: bool = False


class ScriptBatch:
    """The script calls of one replica, pipelined on one connection in the order they were made."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._cluster = is_cluster(redis)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reset()

    def _reset(self) -> None:
        self._pending: list[_Call] = []  #: made (or to write again) since the last write, in order
        self._link: _Link | None = None
        self._writer: asyncio.Task[None] | None = None
        self._lost = False  #: a connection was lost: Redis is to answer a PING before the next write
        #: calls answered NOSCRIPT (Redis forgot their script), in the order they were made: nothing is written while
        #: there are any, until their scripts are loaded and they are on their way again
        self._forgotten: list[_Call] = []
        self._loading = False
        self._tasks: set[asyncio.Task[None]] = set()  #: strong references to the readers, loads and hand-backs

    async def run(self, script: AsyncScript, keys: Sequence[str], args: Args) -> object:
        """The reply of `script` over `keys` and `args` (its error raised), sent with the turn's other calls."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # calls left on a loop that stopped before they ended are no one's
            self._loop = loop
            self._reset()
        if self._cluster:  # not the broker's use (a cluster pipeline splits by node): one call after another
            (reply,) = await run_many(self._redis, script, [(keys, args)])
            return reply
        call = _Call(script, keys, args, loop.create_future())
        self._queue(call)
        return await call.reply

    def _queue(self, call: _Call) -> None:
        self._pending.append(call)
        self._write_soon()

    def _write_soon(self) -> None:
        # it writes in the next loop turn, with the calls made in this one (a writer cancelled before it began ran
        # no `finally`: it is done, not on its way)
        if self._writer is None or self._writer.done():
            self._writer = self._spawn(self._write())

    def _spawn(self, work: Coroutine[object, object, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _write(self) -> None:
        """Write the pending calls, and those made while that write was on its way, until none is left."""
        try:
            while self._pending and not self._forgotten:
                reached = await self._reached()
                link = (self._link or await self._borrow()) if reached is None else None
                if self._forgotten:  # answered NOSCRIPT meanwhile: nothing is written until those calls go again
                    if link is not None and not link.unanswered and link.reader is None:
                        self._link = None
                        await self._redis.connection_pool.release(link.connection)
                    break
                calls, self._pending = self._pending, []
                if link is None:  # Redis cannot be reached (redis-py's connect() retried): the calls fail
                    for call in calls:
                        _settle(call, reached or ConnectionError("Redis cannot be reached"))
                    continue
                packed = _packed(link.connection, calls)
                if not calls:  # none could be packed
                    if not link.unanswered and link.reader is None:
                        self._link = None
                        await self._redis.connection_pool.release(link.connection)
                    continue
                link.unanswered.extend(calls)  # before the write: its replies may be read as soon as it is out
                if link.reader is None:
                    link.reader = self._spawn(self._read(link))
                try:
                    await link.connection.send_packed_command(packed, check_health=False)
                except asyncio.CancelledError:  # the loop stops: nothing will read the replies
                    await self._abandon(link)
                    raise
                except Exception as error:  # the connection failed: its unanswered calls go first on the next
                    self._lose(link, error)
        finally:
            self._writer = None

    async def _reached(self) -> Exception | None:
        """After a lost connection, wait for Redis to answer (redis-py's retry and backoff wait out a restart, or
        a Redis that answers LOADING while it reads its data back); the error when it did not."""
        if not self._lost:
            return None
        self._lost = False
        try:
            await self._redis.ping()
        except Exception as error:
            return error
        return None

    async def _borrow(self) -> _Link | None:
        """A pooled connection, held while calls are on their way on it; None when Redis cannot be reached."""
        pool = self._redis.connection_pool
        try:
            connection: AbstractConnection = await pool.get_connection()  # type: ignore[no-untyped-call]  # redis-py
        except Exception:
            return None
        self._link = _Link(connection)
        return self._link

    async def _read(self, link: _Link) -> None:
        """Hand out the link's replies in order until every call written on it has its reply; then give the
        connection back."""
        try:
            while link.unanswered and not link.lost:
                try:
                    reply: object = await link.connection.read_response()
                except ResponseError as error:  # an error reply is its own call's reply only
                    reply = error
                except asyncio.CancelledError:
                    if not link.lost:  # the loop stops (not the reader of a lost connection, cancelled by _lose)
                        await self._abandon(link)
                    raise
                except Exception as error:  # the connection failed
                    self._lose(link, error)
                    return
                call = link.unanswered.popleft()
                if isinstance(reply, NoScriptError) and not call.reloaded:
                    call.reloaded = True
                    self._forgotten.append(call)
                elif isinstance(reply, NoScriptError):
                    _settle(call, NoScriptError("the script could not be loaded"))
                else:
                    _settle(call, reply)
        finally:
            if link.reader is asyncio.current_task():
                link.reader = None
            if not link.lost and not link.unanswered:  # every reply is in: nothing is left unread on it
                if self._link is link:
                    self._link = None
                self._load_soon()
                await self._redis.connection_pool.release(link.connection)

    def _load_soon(self) -> None:
        """Once every call written before has its reply, load the scripts Redis forgot (a restart, SCRIPT FLUSH)."""
        if self._forgotten and not self._loading:
            self._loading = True
            self._spawn(self._load())

    async def _load(self) -> None:
        """Load the forgotten calls' scripts and write those calls again (once), ahead of every call not written
        yet: creates keep the order they were made in. A call written meanwhile that Redis ran (a script it still
        had, or one another client loaded again) keeps its reply."""
        try:
            for script in {id(call.script): call.script for call in self._forgotten}.values():
                await self._redis.script_load(script.script)
        except asyncio.CancelledError:  # the loop stops: nothing more is written (no writer left holding a connection)
            for call in self._forgotten:
                call.reply.cancel()
            self._forgotten, self._loading = [], False
            raise
        except Exception as error:
            for call in self._forgotten:
                _settle(call, error)
        else:
            self._pending[:0] = self._forgotten
        self._forgotten, self._loading = [], False
        if self._pending:
            self._write_soon()

    def _lose(self, link: _Link, error: Exception) -> None:
        """The link's connection failed: its unanswered calls are written again, on another, before any call made
        after them (a call written on `SENDS` lost connections fails with the error)."""
        if link.lost:
            return
        link.lost = True
        if self._link is link:
            self._link = None
        if link.reader is not None and link.reader is not asyncio.current_task():
            link.reader.cancel()
        again = [call for call in link.unanswered if call.sent < SENDS]
        for call in link.unanswered:
            if call.sent >= SENDS:
                _settle(call, error)
        link.unanswered.clear()
        self._pending[:0] = again  # after the forgotten calls, which were written before them
        self._lost = True
        self._spawn(self._hand_back(link.connection))
        self._load_soon()
        if self._pending:
            self._write_soon()

    async def _abandon(self, link: _Link) -> None:
        """The loop stops: the link's calls are cancelled and its connection handed back, closed."""
        link.lost = True
        if self._link is link:
            self._link = None
        if link.reader is not None and link.reader is not asyncio.current_task():
            link.reader.cancel()
        for call in [*self._forgotten, *link.unanswered]:
            call.reply.cancel()
        link.unanswered.clear()
        self._forgotten = []
        await self._hand_back(link.connection)

    async def _hand_back(self, connection: AbstractConnection) -> None:
        await connection.disconnect()  # replies may be left unread on it
        await self._redis.connection_pool.release(connection)


def _packed(connection: AbstractConnection, calls: list[_Call]) -> list[bytes]:
    """The calls' EVALSHAs packed; a call with an argument Redis cannot take has its error and leaves `calls`."""
    packed: list[bytes] = []
    for call in list(calls):
        try:
            packed += connection.pack_command("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
        except Exception as error:
            _settle(call, error)
            calls.remove(call)
        else:
            call.sent += 1
    return packed


def _settle(call: _Call, reply: object) -> None:
    if call.reply.done():  # its caller was cancelled meanwhile
        return
    if isinstance(reply, BaseException):
        call.reply.set_exception(reply)
    else:
        call.reply.set_result(reply)
