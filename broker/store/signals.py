"""Pub/sub nudges: "the stream of job J changed outside its owner; look now" (stop, approval), and
"job J joined the admission line" (`line J`, published by the create's write: every replica's admission
pass then reads J's partition; `new S A J` for a job that took no turn of its key but started at the line's
virtual time, with its score S in the line and its turn's advance A: a pass moves the virtual time past it, SPEC
S4.2). An older replica takes `new …` for a nudge of no job of its own and ignores it (the work stream's doorbell
still names J).

Classic PUBLISH reaches the subscribers of every node of a cluster, so on a cluster a replica subscribes
through a plain connection to one node (a random one of the topology the client knows); when that node goes
away the subscription ends, and the caller subscribes again, elsewhere. Nudges are hints: a runner also
re-reads its stream on its own."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Callable
from typing import cast

from redis.asyncio import Redis, RedisCluster

from broker.store import keys
from broker.store.connection import is_cluster

JOINED = "line "  #: the prefix of a message naming a job that joined the admission line
NEWCOMER = "new "  #: the prefix of a message naming a job that joined it at the virtual time
_MESSAGE = ("message", b"message")  #: the kind of a published message's reply (the others: subscribe, pong)


async def nudge(redis: Redis, job_id: str) -> None:
    await redis.publish(keys.SIGNALS, job_id)


def joined_message(job_id: str) -> str:
    """What the create's write publishes for a job that joined the line (the job write script sends it)."""
    return f"{JOINED}{job_id}"


def newcomer_message(job_id: str, place: int, advance: int) -> str:
    """What the create's write publishes instead of `line J` for a job that started at the virtual time."""
    return f"{NEWCOMER}{place} {advance} {job_id}"


def joined(message: str) -> str | None:
    """The job a `line J` or `new S A J` message names; None for a nudge."""
    if message.startswith(JOINED):
        return message[len(JOINED) :]
    entered = newcomer(message)
    return entered[0] if entered is not None else None


def newcomer(message: str) -> tuple[str, int, int] | None:
    """(job, score, advance) of a `new S A J` message; None for any other."""
    if not message.startswith(NEWCOMER):
        return None
    parts = message[len(NEWCOMER) :].split(" ", 2)
    if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return parts[2], int(parts[0]), int(parts[1])


async def nudges(redis: Redis, subscribed: Callable[[], None] = lambda: None) -> AsyncIterator[str]:
    """Messages as they are published (job ids, and `line J`); ends (raises) when the connection drops, so
    callers re-subscribe. `subscribed` is called once listening: what was published before is missed."""
    node_client: Redis | None = None
    if is_cluster(redis):
        cluster = cast(RedisCluster, redis)
        await cluster.initialize()  # a no-op once the client knows the topology (it re-reads it on errors)
        node = cluster.get_random_node()  # a dead one (a failover not seen yet): the caller comes back later
        options = cluster.get_connection_kwargs()
        node_client = Redis(
            host=node.host,
            port=int(node.port),
            username=options.get("username"),
            password=options.get("password"),
            ssl=bool(options.get("ssl")),
            socket_connect_timeout=5,
            decode_responses=True,
        )
    pubsub = (node_client or redis).pubsub(ignore_subscribe_messages=True)
    try:
        await pubsub.subscribe(keys.SIGNALS)
        subscribed()
        connection = pubsub.connection
        assert connection is not None  # subscribe() took it
        while True:
            # Read the connection itself: redis-py's listen() takes a health check and a message dict per message,
            # and every create publishes one (TCP keepalive notices a Redis that vanished, as for commands)
            reply = await connection.read_response(timeout=math.inf, push_request=True)  # as listen() reads
            if isinstance(reply, list) and len(reply) == 3 and reply[0] in _MESSAGE:
                data = reply[2]
                yield data.decode() if isinstance(data, bytes) else str(data)
    finally:
        await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
        if node_client is not None:
            await node_client.aclose()
