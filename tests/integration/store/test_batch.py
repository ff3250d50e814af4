"""The script calls of one loop turn go out in one pipeline (broker/store/batch.py), without waiting for the replies
of the calls before on the same connection: each gets its own reply in order, a script's error fails only its call,
a lost connection's calls go again before later ones, and a Redis that forgot its scripts has them loaded again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import DataError, ResponseError

from broker.store.batch import ScriptBatch
from broker.store.connection import connect

ECHO = "redis.call('RPUSH', KEYS[1], ARGV[1]) return ARGV[1]"
FAIL = "return redis.error_reply('no ' .. ARGV[1])"


async def test_calls_of_one_turn_get_their_own_replies_in_order(redis: Redis) -> None:
    batch = ScriptBatch(redis)
    echo, fail = redis.register_script(ECHO), redis.register_script(FAIL)

    replies = await asyncio.gather(
        *(batch.run(echo, ["{batch}:order"], [str(n)]) for n in range(5)),
        batch.run(fail, ["{batch}:order"], ["luck"]),
        batch.run(echo, ["{batch}:order"], ["5"]),
        return_exceptions=True,
    )

    assert replies[:5] == ["0", "1", "2", "3", "4"] and replies[6] == "5"
    assert isinstance(replies[5], ResponseError) and "no luck" in str(replies[5])
    assert await redis.lrange("{batch}:order", 0, -1) == ["0", "1", "2", "3", "4", "5"]  # sent in call order


async def test_a_lone_call_and_a_batch_after_a_script_flush(redis: Redis) -> None:
    batch = ScriptBatch(redis)
    echo = redis.register_script(ECHO)
    assert await batch.run(echo, ["{batch}:alone"], ["a"]) == "a"

    await redis.script_flush()  # a restarted Redis: the calls load the script and go again
    replies = await asyncio.gather(*(batch.run(echo, ["{batch}:again"], [str(n)]) for n in range(3)))

    assert replies == ["0", "1", "2"]
    assert await redis.lrange("{batch}:again", 0, -1) == ["0", "1", "2"]
    with pytest.raises(ResponseError):
        await batch.run(redis.register_script(FAIL), ["{batch}:alone"], ["way"])


def test_a_batch_left_on_a_stopped_loop_does_not_hold_up_the_next(redis_target: tuple[str, bool]) -> None:
    url, cluster = redis_target
    client = connect(url, cluster=cluster)  # no connection is made before the second loop
    batch, echo = ScriptBatch(client), client.register_script(ECHO)

    async def stopped_before_it_went() -> None:
        alone = asyncio.create_task(batch.run(echo, ["{batch}:loops"], ["alone"]))
        await asyncio.sleep(0)  # nothing else was on its way: this one went alone
        call = asyncio.create_task(batch.run(echo, ["{batch}:loops"], ["lost"]))
        await asyncio.sleep(0)  # the call joined a batch that has not gone yet
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()
        for cancelled in (alone, call):
            with pytest.raises(asyncio.CancelledError):
                await cancelled

    async def next_call() -> object:
        try:
            return await asyncio.wait_for(batch.run(echo, ["{batch}:loops"], ["next"]), 10)
        finally:
            await client.aclose()

    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        first.run_until_complete(stopped_before_it_went())
        assert second.run_until_complete(next_call()) == "next"
    finally:
        first.close()
        second.close()


async def test_batches_made_while_others_are_on_their_way_reach_redis_in_call_order(
    redis_target: tuple[str, bool],
) -> None:
    url, cluster = redis_target
    if cluster:
        pytest.skip("a cluster's calls go one after another, not in batches")  # printed with -rs
    for round_ in range(20):
        client = connect(url, cluster=False)  # an empty pool: each batch on its way needs a connection of its own
        batch, echo = ScriptBatch(client), client.register_script(ECHO)
        key = f"{{batch}}:turns:{round_}"
        calls = []
        for turn in range(8):  # calls made over several loop turns, each turn's batch leaving while others travel
            calls += [asyncio.create_task(batch.run(echo, [key], [f"{turn}.{n}"])) for n in range(8)]
            await asyncio.sleep(0)
        made = [f"{turn}.{n}" for turn in range(8) for n in range(8)]
        try:
            assert await asyncio.gather(*calls) == made
            assert await client.lrange(key, 0, -1) == made  # each call's place is taken in call order
        finally:
            await client.aclose()


@asynccontextmanager
async def writes_paused(redis: Redis) -> AsyncIterator[None]:
    """Redis holds every client's script calls (CLIENT PAUSE WRITE) until the block ends."""
    await redis.client_pause(10_000, all=False)
    try:
        yield
    finally:
        await redis.client_unpause()


async def held_connection(redis: Redis, *, holding_bytes: int = -1) -> dict[str, Any]:
    """The one client Redis holds in a paused call, once its query buffer has more than `holding_bytes` behind
    that call (calls written after it)."""
    deadline = time.monotonic() + 10
    while True:
        held = [client for client in await redis.client_list() if "b" in client["flags"]]
        if len(held) == 1 and int(held[0]["qbuf"]) > holding_bytes:
            return held[0]
        assert len(held) <= 1, held
        assert time.monotonic() < deadline, f"no connection holds calls written after a paused one: {held}"
        await asyncio.sleep(0.02)


async def calls_over_turns(batch: ScriptBatch, echo: Any, key: str, values: list[str]) -> list[asyncio.Task[object]]:
    calls = []
    for value in values:  # each in a loop turn of its own: each its own write
        calls.append(asyncio.create_task(batch.run(echo, [key], [value])))
        await asyncio.sleep(0)
    return calls


async def test_calls_made_while_an_earlier_one_waits_in_redis_are_written_at_once_on_its_connection(
    redis: Redis,
) -> None:
    batch, echo, key = ScriptBatch(redis), redis.register_script(ECHO), "{batch}:pipelined"
    await redis.script_load(ECHO)
    async with writes_paused(redis):
        first = await calls_over_turns(batch, echo, key, ["first"])
        await held_connection(redis)  # the first call waits in Redis, unanswered
        later = await calls_over_turns(batch, echo, key, ["0", "1", "2"])
        # written behind it on the same connection, not held back until its reply: Redis works on the next write
        # while the replica makes the one after
        await held_connection(redis, holding_bytes=3 * len(f"{key}0"))
        assert not any(call.done() for call in first + later)

    assert await asyncio.gather(*first, *later) == ["first", "0", "1", "2"]
    assert await redis.lrange(key, 0, -1) == ["first", "0", "1", "2"]


async def test_calls_on_a_connection_that_is_lost_go_again_in_order_before_later_calls(redis: Redis) -> None:
    batch, echo, key = ScriptBatch(redis), redis.register_script(ECHO), "{batch}:lost"
    await redis.script_load(ECHO)
    async with writes_paused(redis):
        lost = await calls_over_turns(batch, echo, key, ["a", "b", "c"])
        held = await held_connection(redis, holding_bytes=2 * len(f"{key}a"))
        await redis.client_kill_filter(_id=held["id"])  # the calls were written but never ran
        later = await calls_over_turns(batch, echo, key, ["d"])

    assert await asyncio.gather(*lost, *later) == ["a", "b", "c", "d"]
    assert await redis.lrange(key, 0, -1) == ["a", "b", "c", "d"]  # each once, in the order made


async def test_a_call_that_cannot_be_sent_and_a_cancelled_call_leave_the_others_their_replies(redis: Redis) -> None:
    batch, echo, key = ScriptBatch(redis), redis.register_script(ECHO), "{batch}:alone"
    await redis.script_load(ECHO)
    async with writes_paused(redis):
        first = await calls_over_turns(batch, echo, key, ["a"])
        await held_connection(redis)
        unsendable = asyncio.create_task(batch.run(echo, [key], [{"not": "a string"}]))  # type: ignore[list-item]
        cancelled, last = await calls_over_turns(batch, echo, key, ["b", "c"])
        await held_connection(redis, holding_bytes=len(f"{key}b"))
        cancelled.cancel()

    with pytest.raises(DataError):
        await unsendable
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    assert await asyncio.gather(*first, last) == ["a", "c"]
    assert await redis.lrange(key, 0, -1) == ["a", "b", "c"]  # the cancelled call had been written: it ran
    assert await batch.run(echo, [key], ["d"]) == "d"  # its unread reply did not shift the replies after it


async def test_calls_after_redis_forgot_their_script_keep_the_order_they_were_made_in(redis: Redis) -> None:
    batch, echo, key = ScriptBatch(redis), redis.register_script(ECHO), "{batch}:forgot"
    await redis.script_flush()  # a restarted Redis: the first calls are answered NOSCRIPT
    calls = []
    for n in range(400):  # calls made all along, while the first ones' script is loaded again
        calls.append(asyncio.create_task(batch.run(echo, [key], [str(n)])))
        await asyncio.sleep(0)
    made = [str(n) for n in range(400)]

    assert await asyncio.gather(*calls) == made
    assert await redis.lrange(key, 0, -1) == made  # none written past a call waiting for its script


def test_a_loop_stopped_while_forgotten_scripts_load_leaves_no_write_behind(redis_target: tuple[str, bool]) -> None:
    url, cluster = redis_target
    if cluster:
        pytest.skip("a cluster's calls go one after another, not in batches")
    client = connect(url, cluster=False)
    batch, echo, key = ScriptBatch(client), client.register_script(ECHO), "{batch}:stopped-load"

    async def stopped_while_loading() -> None:
        await client.delete(key)
        await client.script_flush()  # the first call is answered NOSCRIPT: its script is loaded again
        forgotten = asyncio.create_task(batch.run(echo, [key], ["forgotten"]))
        deadline = time.monotonic() + 10
        while not batch._loading:  # the load is on its way
            assert time.monotonic() < deadline, "the forgotten script was not loaded"
            await asyncio.sleep(0)
        later = asyncio.create_task(batch.run(echo, [key], ["later"]))  # waits for the load
        for _ in range(3):  # made, and found the writing halted
            await asyncio.sleep(0)
        assert batch._loading
        running = asyncio.all_tasks() - {asyncio.current_task()}
        for task in running:  # as asyncio.run stops its loop
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        assert forgotten.cancelled() and later.cancelled()
        # the loop stops: nothing the batch started may still be running, holding a pooled connection
        assert not asyncio.all_tasks() - {asyncio.current_task()}

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(stopped_while_loading())
        assert not client.connection_pool._in_use_connections  # type: ignore[attr-defined]
    finally:
        loop.run_until_complete(client.aclose())
        loop.close()
