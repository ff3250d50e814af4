"""Cross-site requests change nothing (SPEC S8): once a browser page can stop jobs, any page on the web can
try to. A create, stop or approval that a browser marks as cross-site answers 403 `cross_site_request`
before anything is read or stored; a request without those headers (every non-browser client) passes."""

from __future__ import annotations

import functools
from urllib.parse import urlsplit

from aiohttp import web

from broker.errors import CrossSiteRequest
from broker.http.errors import Handler

_DEFAULT_PORTS = {"http": 80, "https": 443}


def same_site_only(handler: Handler) -> Handler:
    """Wrap a state-changing handler with the cross-site check."""

    @functools.wraps(handler)
    async def checked(request: web.Request) -> web.StreamResponse:
        refuse_cross_site(request)
        return await handler(request)

    return checked


def refuse_cross_site(request: web.Request) -> None:
    """Raise CrossSiteRequest for `Sec-Fetch-Site: cross-site` or an `Origin` of another host than `Host`."""
    if request.headers.get("Sec-Fetch-Site", "").strip().lower() == "cross-site":
        raise CrossSiteRequest("Cross-site requests cannot change jobs", param="Sec-Fetch-Site")
    origin = request.headers.get("Origin")
    if origin is not None and not same_origin_host(origin, request.headers.get("Host", "")):
        raise CrossSiteRequest("Requests from another origin cannot change jobs", param="Origin")


def same_origin_host(origin: str, host: str) -> bool:
    """Whether `origin` (`scheme://host[:port]`) names the `Host` header's host and port (`null`: never)."""
    try:
        parts = urlsplit(origin.strip())
        scheme = parts.scheme.lower()
        if scheme not in _DEFAULT_PORTS or not parts.hostname or parts.path or parts.query or parts.username:
            return False
        target = urlsplit(f"//{host.strip()}")
        if not target.hostname:
            return False
        default = _DEFAULT_PORTS[scheme]
        return (parts.hostname, parts.port or default) == (target.hostname, target.port or default)
    except ValueError:  # a port out of range or a malformed IPv6 literal
        return False
