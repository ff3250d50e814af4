"""Loads each Lua script once and wraps it with typed calls (the replies are narrowed here).

`Scripts.run` is how a write that is followed by a work doorbell goes out: on a single Redis the script and
the doorbell share one round trip (a pipeline on one connection, in that order); on a cluster the doorbell
(another slot) follows the script. With REDIS_WAIT_REPLICAS the script is followed by `WAIT` on the same
connection (see broker/store/durability.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib import resources
from typing import cast

from redis.asyncio import Redis
from redis.asyncio.connection import AbstractConnection
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError
from redis.typing import EncodableT, FieldT

from broker.store.connection import is_cluster
from broker.store.durability import Durability, replicated
from broker.store.keys import WORK

WORK_MAXLEN = 100_000

#: Every script of the store, by file name (tests run each one on a cluster node).
NAMES = (
    "append_events",
    "acquire_lease",
    "renew_lease",
    "release_lease",
    "promote_due",
    "replace_view",
    "remove_deltas",
    "admission_admit",
    "admission_accepted",
    "admission_refused",
    "admission_release",
    "admission_requeue",
    "admission_grant",
    "admission_claim",
    "admission_enter",
    "admission_fair_clear",
    "admission_ties",
    "fair_turn",
    "fair_top_repair",
    "line_figures",
    "board_ack",
    "board_promote",
    "release_lock",
    "reindex_job",
    "upstream_heard",
    "upstream_probe",
    "session_turn",
    "session_release",
    "session_history",
    "callback_claim",
    "callback_result",
    "usage_record",
    "usage_replace",
    "quota_take",
    "quota_wake",
    "quota_forget",
    "quota_return",
    "fair_turn_cost",
    "fair_next",
    "fair_promote",
    "fair_settle",
    "fair_fresh",
    "line_heads",
    "fair_unpark",
)


def source(name: str) -> str:
    return resources.files("broker.store").joinpath("scripts", f"{name}.lua").read_text()


def key_step_source() -> str:
    """fair_next.lua with fair_promote.lua as its local function `fair_promote(KEYS, ARGV)`: on a single Redis a pass's
    key step places the front it expected in the same script (SPEC S4.2 "What a turn costs")."""
    return f"local function fair_promote(KEYS, ARGV)\n{source('fair_promote')}\nend\n{source('fair_next')}"


def job_write_source() -> str:
    """append_events.lua with fair_turn_cost.lua as its local function `fair_turn_cost(KEYS, ARGV)`: on a single
    Redis a create takes its key's cost-aware turn inside its job write (SPEC S4.2 "What a turn costs"). The function's
    parameters shadow the script's KEYS and ARGV, so the turn's script reads as it does on its own (a cluster runs it
    alone, in its key's slot)."""
    return f"local function fair_turn_cost(KEYS, ARGV)\n{source('fair_turn_cost')}\nend\n{source('append_events')}"


Args = Sequence[str | bytes | int | float]


class Scripts:
    """The registered scripts of one Redis client (EVALSHA, reloaded on NOSCRIPT by redis-py)."""

    def __init__(self, redis: Redis, durability: Durability | None = None) -> None:
        self._redis = redis
        self._cluster = is_cluster(redis)
        self.durability = durability or Durability()
        self.append_events: AsyncScript = redis.register_script(job_write_source())
        self.acquire_lease: AsyncScript = redis.register_script(source("acquire_lease"))
        self.renew_lease: AsyncScript = redis.register_script(source("renew_lease"))
        self.release_lease: AsyncScript = redis.register_script(source("release_lease"))
        self.promote_due: AsyncScript = redis.register_script(source("promote_due"))
        self.replace_view: AsyncScript = redis.register_script(source("replace_view"))
        self.remove_deltas: AsyncScript = redis.register_script(source("remove_deltas"))
        self.admission_admit: AsyncScript = redis.register_script(source("admission_admit"))
        self.admission_accepted: AsyncScript = redis.register_script(source("admission_accepted"))
        self.admission_refused: AsyncScript = redis.register_script(source("admission_refused"))
        self.admission_release: AsyncScript = redis.register_script(source("admission_release"))
        self.admission_requeue: AsyncScript = redis.register_script(source("admission_requeue"))
        self.admission_grant: AsyncScript = redis.register_script(source("admission_grant"))
        self.admission_claim: AsyncScript = redis.register_script(source("admission_claim"))
        self.admission_enter: AsyncScript = redis.register_script(source("admission_enter"))
        self.admission_fair_clear: AsyncScript = redis.register_script(source("admission_fair_clear"))
        self.admission_ties: AsyncScript = redis.register_script(source("admission_ties"))
        self.fair_turn: AsyncScript = redis.register_script(source("fair_turn"))
        self.upstream_heard: AsyncScript = redis.register_script(source("upstream_heard"))
        self.upstream_probe: AsyncScript = redis.register_script(source("upstream_probe"))
        self.fair_top_repair: AsyncScript = redis.register_script(source("fair_top_repair"))
        self.line_figures: AsyncScript = redis.register_script(source("line_figures"))
        self.session_turn: AsyncScript = redis.register_script(source("session_turn"))
        self.session_release: AsyncScript = redis.register_script(source("session_release"))
        self.session_history: AsyncScript = redis.register_script(source("session_history"))
        self.usage_record: AsyncScript = redis.register_script(source("usage_record"))
        self.usage_replace: AsyncScript = redis.register_script(source("usage_replace"))
        self.quota_take: AsyncScript = redis.register_script(source("quota_take"))
        self.quota_wake: AsyncScript = redis.register_script(source("quota_wake"))
        self.quota_forget: AsyncScript = redis.register_script(source("quota_forget"))
        self.quota_return: AsyncScript = redis.register_script(source("quota_return"))
        # ADMISSION_FAIRNESS_COST (SPEC S4.2 "What a turn costs"): broker/store/cost_store.py
        self.fair_turn_cost: AsyncScript = redis.register_script(source("fair_turn_cost"))
        self.fair_next: AsyncScript = redis.register_script(key_step_source())
        self.fair_promote: AsyncScript = redis.register_script(source("fair_promote"))
        self.fair_settle: AsyncScript = redis.register_script(source("fair_settle"))
        self.fair_fresh: AsyncScript = redis.register_script(source("fair_fresh"))
        self.line_heads: AsyncScript = redis.register_script(source("line_heads"))
        self.fair_unpark: AsyncScript = redis.register_script(source("fair_unpark"))

    async def run(
        self,
        script: AsyncScript,
        *,
        keys: Sequence[str],
        args: Args,
        ring: Mapping[str, str] | None = None,
        durable: bool = True,
    ) -> object:
        """Run `script`; then (when `ring`) add the doorbell `ring` to the work stream. With `durable` and
        REDIS_WAIT_REPLICAS, the script's effects are replicated (WAIT) before this returns, else
        NotReplicated is raised (the write may stand)."""
        wait = self.durability.replicas if durable else 0
        if self._cluster:
            if wait:
                reply = await replicated(self._redis, script, keys, args, self.durability)
            else:
                reply = await script(keys=keys, args=args)
            if ring:
                await ring_work(self._redis, ring)
            return reply
        if not ring and not wait:
            return await script(keys=keys, args=args)
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.execute_command("EVALSHA", script.sha, len(keys), *keys, *args)
            if wait:
                pipe.execute_command("WAIT", wait, self.durability.timeout_ms)
            if ring:
                pipe.xadd(WORK, _fields(ring), maxlen=WORK_MAXLEN, approximate=True)
            replies = await pipe.execute(raise_on_error=False)
        first = replies[0]
        if isinstance(first, NoScriptError):  # a restarted Redis: load it, and do it all again
            await self._redis.script_load(script.script)
            return await self.run(script, keys=keys, args=args, ring=ring, durable=durable)
        if isinstance(first, Exception):
            raise first
        if wait:
            self.durability.check(int(replies[1]))
        return first


async def run_many(redis: Redis, script: AsyncScript, calls: Sequence[tuple[Sequence[str], Args]]) -> list[object]:
    """Run `script` once per `(keys, args)` in one pipeline (one round trip per node); replies in order."""
    replies: list[object] = [None] * len(calls)
    todo = list(range(len(calls)))
    for _ in range(2):
        results = await _evalshas(redis, script.sha, [calls[index] for index in todo])
        missing = []
        for index, result in zip(todo, results, strict=True):
            if isinstance(result, NoScriptError):
                missing.append(index)
            elif isinstance(result, Exception):
                raise result
            else:
                replies[index] = result
        if not missing:
            return replies
        await redis.script_load(script.script)
        todo = missing
    raise NoScriptError("the script could not be loaded")


async def _evalshas(redis: Redis, sha: str, calls: Sequence[tuple[Sequence[str], Args]]) -> list[object]:
    """EVALSHA `sha` once per call, in one write; each reply or error reply in order. On a single Redis the calls are
    packed by the pool's connection (hiredis) and their replies read off it as they are (a redis-py pipeline costs a
    command stack, a callback lookup and an error check per call: more than the write); retried through a brief
    disconnect as redis-py's own commands are."""
    if not calls:
        return []
    if is_cluster(redis):
        async with redis.pipeline(transaction=False) as pipe:
            for call_keys, args in calls:
                pipe.execute_command("EVALSHA", sha, len(call_keys), *call_keys, *args)
            return cast(list[object], await pipe.execute(raise_on_error=False))
    pool = redis.connection_pool
    connection: AbstractConnection = await pool.get_connection()  # type: ignore[no-untyped-call]  # redis-py
    try:
        packed = [
            part
            for call_keys, args in calls
            for part in connection.pack_command("EVALSHA", sha, len(call_keys), *call_keys, *args)
        ]
        return await connection.retry.call_with_retry(
            lambda: _exchange(connection, packed, len(calls)), lambda _: connection.disconnect()
        )
    except BaseException:
        await connection.disconnect()  # replies may be left unread on it (a cancel, a lost connection)
        raise
    finally:
        await pool.release(connection)


async def _exchange(connection: AbstractConnection, packed: list[bytes], count: int) -> list[object]:
    await connection.send_packed_command(packed, check_health=False)
    replies: list[object] = []
    for _ in range(count):
        try:
            replies.append(await connection.read_response())
        except ResponseError as error:  # an error reply is its own call's reply only
            replies.append(error)
    return replies


async def ring_work(redis: Redis, ring: Mapping[str, str]) -> None:
    """A work doorbell: a hint that the line moved (`line`) or a job wants a driver now (`job`)."""
    await redis.xadd(WORK, _fields(ring), maxlen=WORK_MAXLEN, approximate=True)


def as_strings(reply: object) -> list[str]:
    """Narrow a script's array reply (bytes or str items, by client setting) to strings."""
    items = cast(list[bytes | str | int], reply)
    return [item.decode() if isinstance(item, bytes) else str(item) for item in items]


async def ring_jobs(redis: Redis, job_ids: Sequence[str]) -> None:
    """A `job` doorbell for each of `job_ids`, in one pipeline (one slot: the work stream)."""
    async with redis.pipeline(transaction=False) as pipe:
        for job_id in job_ids:
            pipe.xadd(WORK, {"job": job_id}, maxlen=WORK_MAXLEN, approximate=True)
        await pipe.execute()


def _fields(ring: Mapping[str, str]) -> dict[FieldT, EncodableT]:
    return dict(ring.items())
