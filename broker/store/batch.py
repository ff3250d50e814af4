"""Script calls of one replica made in the same turn of the event loop go out together, in one pipeline.

A busy replica writes for many jobs at once (creates, appends of the runners); each call on its own costs
a send and a read of its own (about 130 us of broker CPU per call against about 20 in a pipeline of 32:
bench notes in issue 21). A call made while nothing else is on its way goes at once, alone (a quiet replica
adds no wait to a write); one made while another is on its way joins the batch of its loop turn, which leaves
at the start of the next turn (a task of its own), so no call waits for a timer or for another call's reply.
The calls of a batch keep their order; each gets its own reply or error (a script's error fails only its
call). Only on a single Redis without WAIT: a cluster pipeline splits by node anyway, and a WAIT belongs to the
write it follows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from attrs import define
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError

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
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[_Call] = []
        self._sending: set[asyncio.Task[None]] = set()  #: strong references to the batches on their way
        self._alone = 0  #: calls on their way alone (1 or 0): a call made meanwhile joins the next turn's batch

    async def run(self, script: AsyncScript, keys: Sequence[str], args: Args) -> object:
        """The reply of `script` over `keys` and `args` (its error raised), sent with the turn's other calls."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # calls left on a loop that stopped before they ended are no one's
            self._loop, self._pending, self._sending, self._alone = loop, [], set(), 0
        if not self._pending and not self._sending and not self._alone:  # nothing on its way: go at once, alone
            self._alone += 1
            try:
                return await script(keys=keys, args=args)
            finally:
                self._alone -= 1
        reply: asyncio.Future[object] = loop.create_future()
        self._pending.append(_Call(script, keys, args, reply))
        if len(self._pending) == 1:  # the turn's first call: its batch leaves at the next turn
            task = asyncio.create_task(self._send())
            self._sending.add(task)
            task.add_done_callback(self._sending.discard)
        return await reply

    async def _send(self) -> None:
        calls, self._pending = self._pending, []
        try:
            if len(calls) == 1:
                call = calls[0]
                _settle(call, await call.script(keys=call.keys, args=call.args))
            else:
                await self._pipelined(calls)
        except asyncio.CancelledError:
            for call in calls:
                call.reply.cancel()
            raise
        except Exception as error:  # the connection failed: every call of the batch failed with it
            for call in calls:
                _settle(call, error)

    async def _pipelined(self, calls: list[_Call]) -> None:
        todo = calls
        for _ in range(2):
            async with self._redis.pipeline(transaction=False) as pipe:
                for call in todo:
                    pipe.execute_command("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
                replies = await pipe.execute(raise_on_error=False)
            missing = []
            for call, reply in zip(todo, replies, strict=True):
                if isinstance(reply, NoScriptError):  # a restarted Redis: load it and send those calls again
                    missing.append(call)
                else:
                    _settle(call, reply)
            if not missing:
                return
            for script in {id(call.script): call.script for call in missing}.values():
                await self._redis.script_load(script.script)
            todo = missing
        for call in todo:
            _settle(call, NoScriptError("the script could not be loaded"))


def _settle(call: _Call, reply: object) -> None:
    if call.reply.done():  # its caller was cancelled meanwhile
        return
    if isinstance(reply, BaseException):
        call.reply.set_exception(reply)
    else:
        call.reply.set_result(reply)
