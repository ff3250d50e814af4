"""Which hosts a job callback may name (CALLBACK_ALLOWED_HOSTS) and the create's `callback` field (SPEC S5.8).

Pure: no IO. The allowlist keeps the broker from being a way to reach internal services: a callback URL whose
host is not named (exactly, or under a `*.suffix`) is refused before anything is stored.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

from yarl import URL

MAX_URL = 2048
#: one host name of the allowlist: letters, digits, dots and dashes (an IP address is a host name too)
_HOST = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?")
#: one label of a host name as it is sent (IDN labels in their xn-- form)
_LABEL = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")


class CallbackRefused(ValueError):
    """Raised when a create's `callback` breaks a rule; `path` names the offending field."""

    def __init__(self, path: str, rule: str) -> None:
        super().__init__(f"{path} {rule}")
        self.path = path


def parse_hosts(raw: str) -> tuple[str, ...]:
    """CALLBACK_ALLOWED_HOSTS: comma-separated host names or `*.suffix` patterns, lowercased; blank = none."""
    hosts: list[str] = []
    for item in raw.split(","):
        host = item.strip().lower()
        if not host:
            continue
        name = host[2:] if host.startswith("*.") else host
        if not _HOST.fullmatch(name):
            raise ValueError(f"names {item.strip()!r}, which is neither a host name nor *.suffix")
        hosts.append(host)
    return tuple(hosts)


def allowed(host: str, hosts: tuple[str, ...]) -> bool:
    """Whether `host` is one of `hosts`, or under one of their `*.suffix` patterns (not the suffix itself)."""
    host = host.lower().removesuffix(".")  # an absolute name is the same host
    return any(host.endswith(pattern[1:]) if pattern.startswith("*.") else host == pattern for pattern in hosts)


def allowed_url(url: str, hosts: tuple[str, ...]) -> bool:
    """Whether the host the HTTP client would send `url` to is one of `hosts` (or under a `*.suffix` of them)."""
    try:
        name = URL(url).raw_host
    except ValueError:
        return False
    return name is not None and allowed(name, hosts)


def parse_callback(value: Any, hosts: tuple[str, ...]) -> str:
    """The callback URL of a create's `callback` object (other members are ignored, as unknown fields of a create
    are); CallbackRefused naming the path otherwise.

    The host is judged as the sender's HTTP client reads the URL (IDN labels in their xn-- form), and must be a
    host name it can send to: a URL that only looks allowed, or that no delivery could ever reach, is refused
    here rather than retried for the whole retry window."""
    if not isinstance(value, dict):
        raise CallbackRefused("callback", 'must be an object {"url": "https://..."}')
    url = value.get("url")
    if not isinstance(url, str) or not url or len(url) > MAX_URL:
        raise CallbackRefused("callback.url", f"must be an http or https URL of at most {MAX_URL} characters")
    if any(char <= " " or char == "\x7f" for char in url):  # spaces and control characters: parsers differ
        raise CallbackRefused("callback.url", "must be an http or https URL")
    try:
        parts, sent = urlsplit(url), URL(url)
        host, user, password, _ = parts.hostname, parts.username, parts.password, parts.port
        name = sent.raw_host
    except ValueError:
        raise CallbackRefused("callback.url", "must be an http or https URL") from None
    if parts.scheme not in ("http", "https") or sent.scheme != parts.scheme or not host or not name:
        raise CallbackRefused("callback.url", "must be an http or https URL")
    if user is not None or password is not None or sent.raw_user is not None or sent.raw_password is not None:
        raise CallbackRefused("callback.url", "must not contain a username or password")
    if not all(_LABEL.fullmatch(label) for label in name.lower().removesuffix(".").split(".")):
        raise CallbackRefused("callback.url", "must name a host name (letters, digits and dashes between dots)")
    if not allowed(name, hosts):
        raise CallbackRefused("callback.url", "names a host that is not in CALLBACK_ALLOWED_HOSTS")
    return url
