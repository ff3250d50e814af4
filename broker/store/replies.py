"""Script and raw command replies as Python values: redis-py types them loosely (ints, bytes or str; RESP2 or
RESP3 shapes)."""

from __future__ import annotations

from typing import cast


def scored(reply: object) -> list[tuple[str, float]]:
    """A raw ZRANGE ... WITHSCORES reply as (member, score) pairs: RESP2 sends [member, score, ...], RESP3
    (the cluster client) [[member, score], ...]."""
    items = cast(list[object], reply)
    if items and isinstance(items[0], list | tuple):
        return [(str(member), float(score)) for member, score in cast(list[tuple[str, float]], items)]
    flat = cast(list[str], items)
    return [(flat[i], float(flat[i + 1])) for i in range(0, len(flat), 2)]


def text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def ints_and_ids(reply: object) -> list[str]:
    # redis-py types script replies loosely: a list of ints and bytes/str
    return [x.decode() if isinstance(x, bytes) else str(x) for x in cast(list[bytes | str | int], reply)]
