"""ADMISSION_QUOTAS (SPEC S4.4): parsing is strict and names the path of a bad value; a key's quota wins field by
field over the default; the bound on waiting jobs refuses exactly from the limit on."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.admission.quotas import FIELDS, WINDOWS, Bound, Quota, Quotas, bound_of, full, parse_quotas

counts = st.none() | st.integers(min_value=1, max_value=10**9)
fairness_keys = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=64)


@st.composite
def quotas_(draw: st.DrawFn) -> Quota:
    tokens = draw(counts)
    window = None if tokens is None else draw(st.sampled_from(sorted(WINDOWS)))
    return Quota(live=draw(counts), waiting=draw(counts), tokens=tokens, window=window)


def _document(quota: Quota) -> dict[str, Any]:
    return {name: getattr(quota, name) for name in FIELDS if getattr(quota, name) is not None}


@given(quotas_(), st.dictionaries(fairness_keys, quotas_(), max_size=5))
def test_what_is_written_is_read(default: Quota, keyed: dict[str, Quota]) -> None:
    raw = orjson.dumps({"default": _document(default), "keys": {key: _document(q) for key, q in keyed.items()}})
    assert parse_quotas(raw.decode()) == Quotas(default, tuple(keyed.items()))


@given(quotas_(), quotas_(), fairness_keys)
def test_a_keys_own_quota_wins_field_by_field(default: Quota, own: Quota, key: str) -> None:
    quotas = Quotas(default, ((key, own),))
    chosen = quotas.of(key)
    assert chosen.live == (own.live if own.live is not None else default.live)
    assert chosen.waiting == (own.waiting if own.waiting is not None else default.waiting)
    assert (chosen.tokens, chosen.window) == (
        (own.tokens, own.window) if own.tokens is not None else (default.tokens, default.window)
    )
    assert quotas.of(key + "-other") == default


@given(
    st.builds(Bound, key=st.integers(0, 50), all=st.integers(0, 50)),
    st.integers(0, 60),
    st.integers(0, 60),
)
def test_a_create_is_refused_exactly_from_a_bound_on(bound: Bound, key_waiting: int, all_waiting: int) -> None:
    scope = full(bound, key_waiting, all_waiting)
    key_full = bool(bound.key) and key_waiting >= bound.key
    all_full = bool(bound.all) and all_waiting >= bound.all
    assert scope == ("key" if key_full else "all" if all_full else None)
    if scope is not None:  # more waiting jobs never make room
        assert full(bound, key_waiting + 1, all_waiting + 1) is not None


def test_the_bound_of_a_create_is_its_keys_waiting_quota_and_the_lines() -> None:
    quotas = Quotas(Quota(waiting=100), (("batch", Quota(waiting=5)), ("live-only", Quota(live=2))))
    assert bound_of(quotas, 0, "batch") == Bound(key=5, all=0)
    assert bound_of(quotas, 1000, "live-only") == Bound(key=100, all=1000)
    assert bound_of(Quotas(), 0, "any") == Bound() and not Bound()
    assert not Quotas() and quotas


def test_live_and_tokens_are_named_as_not_enforced() -> None:
    quotas = parse_quotas('{"default": {"live": 4, "waiting": 9}, "keys": {"b": {"tokens": 9, "window": "7d"}}}')
    assert quotas.unenforced() == ["default.live", "keys.b.tokens"]
    assert parse_quotas('{"default": {"waiting": 9}}').unenforced() == []


@pytest.mark.parametrize("blank", ["", "  ", "{}", '{"keys": {}}'])
def test_blank_or_empty_is_no_quota(blank: str) -> None:
    assert parse_quotas(blank) == Quotas()


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ("[]", "a JSON object"),
        ("{", "is not JSON"),
        ('{"defaults": {}}', "defaults is not one of default, keys"),
        ('{"default": 4}', "default must be an object"),
        ('{"default": {"waiting": 0}}', "default.waiting must be an integer of at least 1"),
        ('{"default": {"waiting": 2.5}}', "default.waiting must be an integer"),
        ('{"default": {"waiting": true}}', "default.waiting must be an integer"),
        ('{"default": {"waiting": "10"}}', "default.waiting must be an integer"),
        ('{"default": {"waiting": null}}', "default.waiting is null"),
        ('{"default": {"Live": 2}}', "default.Live is not one of live, waiting, tokens, window"),
        ('{"keys": []}', "keys must be an object"),
        ('{"keys": {"batch": {"live": -1}}}', "keys.batch.live must be an integer of at least 1"),
        ('{"keys": {"batch": {"tokens": 10}}}', "keys.batch must set tokens and window together"),
        ('{"keys": {"batch": {"window": "1d"}}}', "keys.batch must set tokens and window together"),
        ('{"keys": {"batch": {"tokens": 10, "window": "2d"}}}', "keys.batch.window must be one of 1h, 1d, 7d"),
        ('{"keys": {"' + "k" * 257 + '": {}}}', "longer than 256"),
    ],
)
def test_a_bad_value_is_named_by_its_path(raw: str, path: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_quotas(raw)
    assert path in str(caught.value)
