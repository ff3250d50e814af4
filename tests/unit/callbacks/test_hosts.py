"""CALLBACK_ALLOWED_HOSTS and the create's `callback` field (SPEC S5.8)."""

from __future__ import annotations

import pytest

from broker.callbacks.hosts import CallbackRefused, allowed, parse_callback, parse_hosts
from broker.config import Config
from broker.errors import ConfigError


def test_hosts_are_names_or_suffix_patterns_lowercased() -> None:
    assert parse_hosts(" Hooks.Example.com, *.example.org ,,10.0.0.1") == (
        "hooks.example.com",
        "*.example.org",
        "10.0.0.1",
    )
    assert parse_hosts("") == ()


@pytest.mark.parametrize("raw", ["https://hooks.example.com", "hooks.example.com:443", "*", "a/b", "*.", "-a.com"])
def test_anything_else_stops_startup_naming_the_variable(raw: str) -> None:
    with pytest.raises(ConfigError, match="CALLBACK_ALLOWED_HOSTS"):
        Config.from_env({"CALLBACK_ALLOWED_HOSTS": raw})


def test_a_suffix_pattern_allows_hosts_under_it_not_the_suffix_itself() -> None:
    hosts = ("hooks.example.com", "*.example.org")
    assert allowed("HOOKS.example.com", hosts) and allowed("a.b.example.org", hosts)
    assert not allowed("example.org", hosts)
    assert not allowed("evilexample.org", hosts)
    assert not allowed("hooks.example.com.evil.net", hosts)
    assert not allowed("hooks.example.com", ())


def test_the_signing_secret_is_hidden_from_errors_like_the_boards() -> None:
    with pytest.raises(ConfigError) as raised:
        Config.from_env({"CALLBACK_SIGNING_SECRET": "whsec_not-base64"})
    assert "<hidden>" in str(raised.value) and "not-base64" not in str(raised.value)


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"url": "https://other.example.net/"}, "callback.url"),
        ({"url": "https://[::1/"}, "callback.url"),
        ({"url": "https://hooks.example.com:99999/"}, "callback.url"),
        ({"url": None}, "callback.url"),
        ([], "callback"),
    ],
)
def test_a_refused_callback_names_its_path(value: object, path: str) -> None:
    with pytest.raises(CallbackRefused) as refused:
        parse_callback(value, ("hooks.example.com",))
    assert refused.value.path == path and str(refused.value).startswith(path + " ")


def test_an_allowed_url_is_kept_exactly_as_given() -> None:
    url = "https://Hooks.example.com:8443/h?x=1#f"
    assert parse_callback({"url": url}, ("hooks.example.com",)) == url
