"""ADMISSION_QUOTAS (SPEC S4.4): parsing is strict and names the path of a bad value; a key's quota wins field by
field over the default; the bound on waiting jobs refuses exactly from the limit on."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.admission.quotas import (
    FIELDS,
    WINDOWS,
    Bound,
    Quota,
    Quotas,
    bound_of,
    budget_hours,
    budget_retry,
    full,
    parse_quotas,
)

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


def test_only_live_and_tokens_make_passes_take_quotas() -> None:
    quotas = parse_quotas('{"default": {"waiting": 9}, "keys": {"b": {"tokens": 9, "window": "7d"}}}')
    assert quotas.enforced() and parse_quotas('{"default": {"live": 1}}').enforced()
    assert not parse_quotas('{"default": {"waiting": 9}}').enforced() and not Quotas().enforced()


HOUR = 3_600_000
NOW = 1_000 * HOUR + 1_234  # a little into hour 1000


def _hour(back: int) -> int:
    return (1_000 - back) * HOUR // 1000


def test_a_budget_counts_the_windows_hours_up_to_the_current_one() -> None:
    assert budget_hours(NOW, "1h") == [_hour(0)]
    assert budget_hours(NOW, "1d") == [_hour(back) for back in range(24)]
    assert len(budget_hours(NOW, "7d")) == 168


def test_a_key_within_its_budget_has_no_retry() -> None:
    quota = Quota(tokens=1_000, window="1d")
    assert budget_retry({_hour(0): 500, _hour(23): 499}, NOW, quota) is None
    assert budget_retry({_hour(24): 5_000}, NOW, quota) is None  # out of the window
    assert budget_retry({}, NOW, Quota(live=3)) is None


def test_a_key_over_its_budget_starts_again_when_enough_hours_left_the_window() -> None:
    quota = Quota(tokens=1_000, window="1d")
    # 600 tokens 23 hours ago (leaves at this hour's end), 300 two hours ago, 200 now: 1,100
    used = {_hour(23): 600, _hour(2): 300, _hour(0): 200}
    assert budget_retry(used, NOW, quota) == 1_001 * HOUR
    # the oldest leaving is not enough: 900 + 200 = 1,100 stays until the hour of 300 leaves too
    used = {_hour(23): 100, _hour(2): 900, _hour(0): 200}
    assert budget_retry(used, NOW, quota) == (1_001 + 21) * HOUR
    # one hour's window: the budget comes back when the hour ends
    assert budget_retry({_hour(0): 1_000}, NOW, Quota(tokens=1_000, window="1h")) == 1_001 * HOUR


@given(
    used=st.dictionaries(st.integers(0, 30), st.integers(0, 2_000), max_size=30),
    tokens=st.integers(1, 10_000),
    window=st.sampled_from(["1h", "1d"]),
    into=st.integers(0, HOUR - 1),
)
def test_the_retry_is_the_first_hour_end_at_which_the_window_is_within_budget(
    used: dict[int, int], tokens: int, window: str, into: int
) -> None:
    now = 1_000 * HOUR + into
    by_hour = {_hour(back): n for back, n in used.items()}
    quota = Quota(tokens=tokens, window=window)
    retry = budget_retry(by_hour, now, quota)

    def spent(at: int) -> int:
        return sum(by_hour.get(hour, 0) for hour in budget_hours(at, window) if hour * 1000 <= now)

    if retry is None:
        assert spent(now) < tokens
        return
    assert spent(now) >= tokens and retry > now and retry % HOUR == 0
    assert spent(retry) < tokens  # within the budget then
    assert retry == 1_001 * HOUR or spent(retry - HOUR) >= tokens  # and not an hour earlier


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
