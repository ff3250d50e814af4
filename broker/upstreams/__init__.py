"""The Hermes deployments the broker feeds (SPEC S10): parsed from `HERMES_URL` and its companion lists.

Pure values, no IO: config validates them at startup, the composition root builds one Hermes client per upstream.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlsplit

import attrs
from attrs import frozen

from broker.errors import ConfigError


@frozen(kw_only=True)
class Upstream:
    """One Hermes deployment: `index` is its place in `HERMES_URL` (0 = the first, on today's stored keys)."""

    index: int
    name: str  #: the URL without scheme or credentials: `hermes-1:8642`, `10.0.0.7:8642/agent`
    url: str = attrs.field(repr=False)  #: may carry credentials: never printed
    api_key: str | None = attrs.field(default=None, repr=False)  # a secret: never printed
    max_concurrent: int = 0  #: 0 = learnt from its answers (SPEC S4.1)


def parse_urls(raw: str) -> tuple[str, ...]:
    """`HERMES_URL`: one or more http(s) base URLs, comma-separated, each naming a different upstream.

    Raises ValueError (the variable's reason) for a bad item, an empty item or a name given twice.
    """
    urls: list[str] = []
    names: set[str] = set()
    items = raw.split(",")
    for number, item in enumerate(items, start=1):
        which = f"(item {number} of {len(items)})" if len(items) > 1 else ""
        url = item.strip().rstrip("/")
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{which} is not an http(s) URL".strip())
        name = upstream_name(url)
        if name in names:
            raise ValueError(f"names the upstream {name} twice")
        names.add(name)
        urls.append(url)
    return tuple(urls)


def upstream_name(url: str) -> str:
    """The URL without scheme, credentials, query or trailing slash: `http://u:p@hermes-1:8642/` -> `hermes-1:8642`."""
    parts = urlsplit(url.strip())
    return parts.netloc.rpartition("@")[2] + parts.path.rstrip("/")


def build(urls: Sequence[str], api_key: str | None, limits: Sequence[int]) -> tuple[Upstream, ...]:
    """The upstreams of `HERMES_URL`, with `HERMES_API_KEY` and `HERMES_MAX_CONCURRENT` spread over them.

    A list of one value is for every upstream; otherwise it must have one item per upstream (ConfigError naming
    the variable, never showing a key). With one upstream the key is taken whole, commas and all (as before).
    """
    count = len(urls)
    if len(limits) not in (1, count):
        shown = ",".join(str(limit) for limit in limits)
        raise ConfigError(
            f"HERMES_MAX_CONCURRENT={shown!r} has {len(limits)} values, but HERMES_URL names {count} upstreams"
            " (give one value for all or one per upstream)"
        )
    keys: list[str | None]
    if api_key is None:
        keys = [None] * count
    elif count == 1 or "," not in api_key:
        keys = [api_key or None] * count
    else:
        items = api_key.split(",")
        if len(items) != count:
            raise ConfigError(
                f"HERMES_API_KEY=<hidden> has {len(items)} items, but HERMES_URL names {count} upstreams"
                " (give one key for all or one per upstream; an empty item: no key)"
            )
        keys = [item.strip() or None for item in items]
    for number, (url, key) in enumerate(zip(urls, keys, strict=True), start=1):
        if key is not None and "@" in urlsplit(url).netloc:  # one Authorization header: basic or bearer, not both
            which = f" (item {number} of {count})" if count > 1 else ""
            raise ConfigError(
                f"HERMES_URL{which} carries user:password@ and HERMES_API_KEY=<hidden> gives it a bearer key"
                " (Hermes takes one Authorization header: give one or the other)"
            )
    return tuple(
        Upstream(
            index=index,
            name=upstream_name(url),
            url=url,
            api_key=keys[index],
            max_concurrent=limits[0] if len(limits) == 1 else limits[index],
        )
        for index, url in enumerate(urls)
    )
