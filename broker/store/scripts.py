"""Loads each Lua script once and wraps it with typed calls (the replies are narrowed here)."""

from __future__ import annotations

from importlib import resources
from typing import cast

from redis.asyncio import Redis
from redis.commands.core import AsyncScript


def _source(name: str) -> str:
    return resources.files("broker.store").joinpath("scripts", f"{name}.lua").read_text()


class Scripts:
    """The registered scripts of one Redis client (EVALSHA, reloaded on NOSCRIPT by redis-py)."""

    def __init__(self, redis: Redis) -> None:
        self.append_events: AsyncScript = redis.register_script(_source("append_events"))
        self.acquire_lease: AsyncScript = redis.register_script(_source("acquire_lease"))
        self.renew_lease: AsyncScript = redis.register_script(_source("renew_lease"))
        self.release_lease: AsyncScript = redis.register_script(_source("release_lease"))
        self.promote_due: AsyncScript = redis.register_script(_source("promote_due"))
        self.replace_view: AsyncScript = redis.register_script(_source("replace_view"))
        self.admission_admit: AsyncScript = redis.register_script(_source("admission_admit"))
        self.admission_accepted: AsyncScript = redis.register_script(_source("admission_accepted"))
        self.admission_refused: AsyncScript = redis.register_script(_source("admission_refused"))
        self.admission_release: AsyncScript = redis.register_script(_source("admission_release"))
        self.admission_requeue: AsyncScript = redis.register_script(_source("admission_requeue"))


def as_strings(reply: object) -> list[str]:
    """Narrow a script's array reply (bytes or str items, by client setting) to strings."""
    items = cast(list[bytes | str | int], reply)
    return [item.decode() if isinstance(item, bytes) else str(item) for item in items]
