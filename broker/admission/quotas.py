"""Quotas per fairness key (SPEC S4.4): the `ADMISSION_QUOTAS` model, its strict parsing, and the bound on waiting
jobs a create must respect. Pure: no IO, no clock.

`ADMISSION_QUOTAS` is a JSON object `{"default": {...}, "keys": {"<fairness key>": {...}}}`; each quota may set
`live`, `waiting`, and `tokens` with its `window` (`1h`, `1d`, `7d`). A key's own quota wins field by field over the
default. A bad value raises ValueError naming its path (`keys.batch.live must be an integer of at least 1`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Literal

import orjson
from attrs import field, frozen

HOUR_MS = 3_600_000
WINDOWS: Mapping[str, int] = {"1h": HOUR_MS, "1d": 24 * HOUR_MS, "7d": 168 * HOUR_MS}  #: `window` -> ms
FIELDS = ("live", "waiting", "tokens", "window")
MAX_KEY_LENGTH = 256  #: the longest fairness key a job can have (a session key taken as it is, SPEC S4.2)
Scope = Literal["key", "all"]  #: what a refused create ran into: its key's `waiting`, or ADMISSION_MAX_WAITING


@frozen
class Quota:
    """One key's limits; None: no limit of that kind."""

    live: int | None = None  #: most live Hermes runs of the key
    waiting: int | None = None  #: most jobs of the key waiting in the line
    tokens: int | None = None  #: most `usage.total_tokens` of the key's runs settled within `window`
    window: str | None = None  #: one of WINDOWS, with `tokens`

    def over(self, base: Quota) -> Quota:
        """This quota's fields where it sets them, `base`'s elsewhere."""
        return Quota(
            live=base.live if self.live is None else self.live,
            waiting=base.waiting if self.waiting is None else self.waiting,
            tokens=base.tokens if self.tokens is None else self.tokens,
            window=base.window if self.tokens is None else self.window,
        )


def _sorted(pairs: Iterable[tuple[str, Quota]]) -> tuple[tuple[str, Quota], ...]:
    return tuple(sorted(pairs, key=lambda pair: pair[0]))


@frozen
class Quotas:
    """The default quota and the keys' own ones."""

    default: Quota = Quota()
    keys: tuple[tuple[str, Quota], ...] = field(default=(), converter=_sorted)
    _by_key: Mapping[str, Quota] = field(init=False, eq=False, repr=False)  #: `keys` looked up once per create

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_by_key", dict(self.keys))

    def __bool__(self) -> bool:
        return self != NO_QUOTAS

    def of(self, key: str) -> Quota:
        """The quota that applies to a fairness key."""
        own = self._by_key.get(key)
        return self.default if own is None else own.over(self.default)

    def waiting(self, key: str) -> int | None:
        return self.of(key).waiting

    def enforced(self) -> bool:
        """Does any quota limit live runs or tokens (so that passes take them, broker/store/quota.py)?"""
        return any(quota.live or quota.tokens for quota in (self.default, *(quota for _, quota in self.keys)))


NO_QUOTAS = Quotas()


@frozen
class Bound:
    """The waiting bounds a create checks (0: none): its key's `waiting` quota and ADMISSION_MAX_WAITING."""

    key: int = 0
    all: int = 0

    def __bool__(self) -> bool:
        return bool(self.key or self.all)


def bound_of(quotas: Quotas, max_waiting: int, fairness_key: str) -> Bound:
    return Bound(key=quotas.waiting(fairness_key) or 0, all=max_waiting)


def full(bound: Bound, key_waiting: int, all_waiting: int) -> Scope | None:
    """What a create runs into when its key has `key_waiting` jobs in the line and the line `all_waiting`: the first
    bound already reached (the key's first), or None when the job may join. append_events.lua decides the same."""
    if bound.key and key_waiting >= bound.key:
        return "key"
    if bound.all and all_waiting >= bound.all:
        return "all"
    return None


def budget_hours(now_ms: int, window: str) -> list[int]:
    """The hours (epoch seconds of their starts) a token budget of `window` counts at `now_ms`: the current hour
    and those before it, as many as the window holds (SPEC S4.4: sliding, in hourly buckets)."""
    current = now_ms // HOUR_MS * HOUR_MS
    return [(current - back * HOUR_MS) // 1000 for back in range(WINDOWS[window] // HOUR_MS)]


def budget_retry(used: Mapping[int, int], now_ms: int, quota: Quota) -> int | None:
    """When a key that used `used` tokens per hour (epoch seconds -> tokens) may start runs again: None while it is
    within its budget, else the first hour's end at which the hours still in the window used fewer than `tokens`."""
    if not quota.tokens or quota.window is None:
        return None
    hours = sorted(budget_hours(now_ms, quota.window))  # oldest first: the first to leave the window
    if sum(used.get(hour, 0) for hour in hours) < quota.tokens:
        return None
    current_end = (now_ms // HOUR_MS + 1) * HOUR_MS
    for gone in range(1, len(hours) + 1):
        if sum(used.get(hour, 0) for hour in hours[gone:]) < quota.tokens:
            return current_end + (gone - 1) * HOUR_MS
    return current_end + (len(hours) - 1) * HOUR_MS  # unreachable: an empty window uses nothing


def parse_quotas(raw: str) -> Quotas:
    """`ADMISSION_QUOTAS`; blank is no quota."""
    if not raw.strip():
        return Quotas()
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ValueError("is not JSON") from None
    if not isinstance(document, dict):
        raise ValueError("must be a JSON object with default and keys")
    _only(document, ("default", "keys"), "")
    default = _quota(document.get("default", {}), "default")
    keyed = document.get("keys", {})
    if not isinstance(keyed, dict):
        raise ValueError("keys must be an object of fairness key -> quota")
    pairs: list[tuple[str, Quota]] = []
    for key, value in keyed.items():
        if len(key) > MAX_KEY_LENGTH:
            raise ValueError(f"keys.{key[:20]}... is longer than {MAX_KEY_LENGTH} characters (no fairness key is)")
        pairs.append((key, _quota(value, f"keys.{key}")))
    return Quotas(default, tuple(pairs))


def _quota(value: object, path: str) -> Quota:
    if not isinstance(value, dict):
        raise ValueError(f"{path} must be an object with live, waiting, tokens, window")
    _only(value, FIELDS, path)
    for name in FIELDS:
        if name in value and value[name] is None:
            raise ValueError(f"{path}.{name} is null: leave it out for no limit")
    numbers = {name: _count(value.get(name), f"{path}.{name}") for name in ("live", "waiting", "tokens")}
    window = value.get("window")
    if window is not None and window not in WINDOWS:
        raise ValueError(f"{path}.window must be one of {', '.join(WINDOWS)}")
    if (numbers["tokens"] is None) != (window is None):
        raise ValueError(f"{path} must set tokens and window together")
    return Quota(live=numbers["live"], waiting=numbers["waiting"], tokens=numbers["tokens"], window=window)


def _count(value: object, path: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{path} must be an integer of at least 1")
    return value


def _only(document: Mapping[str, object], known: tuple[str, ...], path: str) -> None:
    for name in document:
        if name not in known:
            where = f"{path}.{name}" if path else name
            raise ValueError(f"{where} is not one of {', '.join(known)}")
