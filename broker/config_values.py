"""How the text of a variable becomes its value: the parsers of broker/config.py's table. Each raises ValueError
with the reason (the caller names the variable and shows the value, credentials masked)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from urllib.parse import urlsplit

from broker.upstreams import parse_urls

SECRET_PREFIX = "whsec_"  #: Standard Webhooks' symmetric secret form: the prefix, then standard base64 of the key
SECRET_BYTES = (24, 64)  #: the key length Standard Webhooks asks of a symmetric secret (192 to 512 bits)
MAX_FAIRNESS_WEIGHT = 1_000.0


def without_credentials(raw: str) -> str:
    """A value as an error shows it: URLs' `user:password@` masked (a bad HERMES_URL list may carry some)."""
    return ",".join(
        item if "://" not in item or "@" not in item else f"{item.partition('://')[0]}://***@{item.rpartition('@')[2]}"
        for item in raw.split(",")
    )


def boolean_or_false(raw: str) -> bool:
    try:
        return boolean(raw)
    except ValueError:
        return False


def integer(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError("is not an integer") from None
        if value < minimum:
            raise ValueError(f"must be at least {minimum}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be at most {maximum}")
        return value

    return parse


def boolean(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("is not a boolean (true/false)")


def urls(raw: str) -> str:
    return ",".join(parse_urls(raw))


def integers(minimum: int) -> Callable[[str], tuple[int, ...]]:
    one = integer(minimum)

    def parse(raw: str) -> tuple[int, ...]:
        items = raw.split(",")
        if len(items) == 1:
            return (one(raw),)
        values: list[int] = []
        for number, item in enumerate(items, start=1):
            try:
                values.append(one(item))
            except ValueError as exc:
                raise ValueError(f"(item {number} of {len(items)}) {exc}") from None
        return tuple(values)

    return parse


def url(raw: str) -> str:
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("is not an http(s) URL")
    return raw.strip().rstrip("/")


def redis_url(raw: str) -> str | None:
    if not raw.strip():
        return None  # an empty REDIS_URL means "embedded", as unset does
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError("is not a redis://, rediss:// or unix:// URL")
    return raw.strip()


def choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value == "warning":
            value = "warn"
        if value not in options:
            raise ValueError(f"is not one of {', '.join(options)}")
        return value

    return parse


def weights(raw: str) -> tuple[tuple[str, float], ...]:
    """`key=weight,key=weight` (a key may hold `=`: the last one separates the weight); 0 < weight <= 1000."""
    pairs: dict[str, float] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        key, sep, number = item.strip().rpartition("=")
        if not sep or not key:
            raise ValueError(f"has {item.strip()!r}, not key=weight")
        try:
            weight = float(number)
        except ValueError:
            raise ValueError(f"has a weight that is not a number: {number!r}") from None
        if not 0 < weight <= MAX_FAIRNESS_WEIGHT:
            raise ValueError(f"has a weight out of range (0, 1000]: {number!r}")
        pairs[key] = weight
    return tuple(pairs.items())


def share(raw: str) -> float:
    """A share in (0, 1], e.g. `0.9`."""
    try:
        value = float(raw.strip())
    except ValueError:
        raise ValueError("is not a number") from None
    if not 0 < value <= 1:  # also refuses nan
        raise ValueError("must be a share in (0, 1]")
    return value


def text(raw: str) -> str:
    return raw


def optional_text(raw: str) -> str | None:
    return raw or None


def signing_secrets(raw: str) -> tuple[bytes, ...]:
    """Space-separated `whsec_<standard base64>` secrets, each of 24 to 64 key bytes; blank = none."""
    words = raw.split()
    keys: list[bytes] = []
    for number, word in enumerate(words, start=1):
        which = f"(secret {number} of {len(words)})"
        if not word.startswith(SECRET_PREFIX):
            raise ValueError(f"{which} does not start with {SECRET_PREFIX}")
        encoded = word[len(SECRET_PREFIX) :]
        try:
            key = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            key = None
        if key is None or base64.b64encode(key).decode() != encoded:  # canonical only: no stray or missing '='
            raise ValueError(f"{which} is not standard base64 (with its = padding) after {SECRET_PREFIX}")
        if not SECRET_BYTES[0] <= len(key) <= SECRET_BYTES[1]:
            raise ValueError(f"{which} holds {len(key)} key bytes, not {SECRET_BYTES[0]} to {SECRET_BYTES[1]}")
        keys.append(key)
    return tuple(keys)


def optional_url(raw: str) -> str | None:
    return url(raw) if raw.strip() else None
