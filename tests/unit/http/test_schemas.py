"""parse_create (SPEC S3.1): what is forwarded, what stays with the broker, what fails."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.config import Config
from broker.errors import BodyTooLarge, InvalidRequest
from broker.events import Context, Link, Reporting
from broker.http.schemas import _PLAIN_URL, parse_create, url_problem
from broker.ids import fingerprint
from broker.jobs.commands import CreateRun

CODES = {
    "invalid_json",
    "missing_input",
    "invalid_input",
    "invalid_field",
    "invalid_context",
    "invalid_reporting",
    "invalid_idempotency_key",
    "invalid_session_key",
}
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
FIELDS = ["input", "instructions", "model", "session_id", "previous_response_id", "conversation_history"]
bodies = st.fixed_dictionaries(
    {},
    optional={name: json_values for name in [*FIELDS, "context", "reporting", "extra"]}
    | {"input": st.text() | json_values},
)


MAX_BODY = Config().hermes_max_body


def _parse(body: Any, **headers: str) -> CreateRun:
    return parse_create(orjson.dumps(body), headers, max_body=MAX_BODY)


def test_only_forwarded_fields_reach_the_execution_body() -> None:
    run = _parse(
        {
            "input": "hi",
            "instructions": "be brief",
            "model": "m",
            "session_id": "s-1",
            "previous_response_id": "resp_1",
            "conversation_history": [{"role": "user", "content": "before"}],
            "context": {"title": "T"},
            "reporting": {"board": False},
            "stream": True,
            "metadata": {"x": 1},
        }
    )
    assert orjson.loads(run.body) == {
        "input": "hi",
        "instructions": "be brief",
        "model": "m",
        "session_id": "s-1",
        "previous_response_id": "resp_1",
        "conversation_history": [{"role": "user", "content": "before"}],
    }
    assert (run.session_id, run.model) == ("s-1", "m")
    assert run.context == Context(title="T")
    assert run.reporting == Reporting(board=False, post=True)


def test_null_forwarded_fields_count_as_absent() -> None:
    run = _parse({"input": "hi", "instructions": None, "model": None, "session_id": None})
    assert orjson.loads(run.body) == {"input": "hi"}


def test_context_is_stored_exactly_as_given() -> None:
    links = [{"text": " Pipeline  ", "url": "https://ci.example/p/1?x=%20"}]
    run = _parse({"input": "hi", "context": {"title": "  Review  ", "url": "http://a.b/c#d", "links": links}})
    assert run.context == Context(
        title="  Review  ", url="http://a.b/c#d", links=(Link(" Pipeline  ", "https://ci.example/p/1?x=%20"),)
    )
    assert b"Review" not in run.body


@pytest.mark.parametrize(("reporting", "flags"), [({}, (True, True)), ({"post": False}, (True, False))])
def test_reporting_flags_resolve_to_true_when_omitted(reporting: dict[str, bool], flags: tuple[bool, bool]) -> None:
    run = _parse({"input": "hi", "reporting": reporting})
    assert (run.reporting.board, run.reporting.post) == flags
    assert _parse({"input": "hi"}).reporting == Reporting(True, True)


def test_the_fingerprint_is_input_and_instructions_only() -> None:
    base = _parse({"input": "hi", "instructions": "x"})
    other = _parse({"input": "hi", "instructions": "x", "model": "m", "session_id": "s", "context": {"title": "t"}})
    assert base.fingerprint == other.fingerprint == fingerprint("hi", "x")
    assert _parse({"input": "hi"}).fingerprint != base.fingerprint


def test_headers_are_kept() -> None:
    run = _parse({"input": "hi"}, **{"Idempotency-Key": "k-1", "X-Hermes-Session-Key": "sess"})
    assert (run.idempotency_key, run.session_key) == ("k-1", "sess")


@given(bodies)
def test_any_object_is_either_a_create_or_a_named_400(body: dict[str, Any]) -> None:
    try:
        run = _parse(body)
    except InvalidRequest as error:
        assert error.code in CODES
        assert error.status == 400
        assert error.message
        return
    forwarded = orjson.loads(run.body)
    assert set(forwarded) <= set(FIELDS)
    assert forwarded["input"]


@given(st.binary())
def test_any_bytes_are_either_a_create_or_a_named_400(raw: bytes) -> None:
    try:
        parse_create(raw, {}, max_body=MAX_BODY)
    except InvalidRequest as error:
        assert error.code in CODES


@given(st.text(), st.text())
def test_any_header_values_are_either_accepted_or_a_named_400(key: str, session: str) -> None:
    try:
        run = _parse({"input": "hi"}, **{"Idempotency-Key": key, "X-Hermes-Session-Key": session})
    except InvalidRequest as error:
        assert error.code in ("invalid_idempotency_key", "invalid_session_key")
        return
    assert run.idempotency_key == key
    assert 1 <= len(key) <= 255 and all(0x21 <= ord(c) <= 0x7E for c in key)


@given(st.text(max_size=300))
def test_an_accepted_session_key_is_text_that_can_be_stored_and_forwarded(session: str) -> None:
    try:
        run = _parse({"input": "hi"}, **{"X-Hermes-Session-Key": session})
    except InvalidRequest as error:
        assert error.code == "invalid_session_key"
        return
    if run.session_key is not None:
        run.session_key.encode()  # UTF-8: what the store hashes and the Hermes client sends
        assert len(run.session_key) <= 256
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in run.session_key)


@pytest.mark.parametrize(
    ("session", "accepted"),
    [("user-42", True), ("café ☃", True), ("\udca1", False), ("a\x85b", False), ("a\x7f", False),
     ("a\tb", False), ("x" * 256, True), ("x" * 257, False)],
)  # fmt: skip
def test_session_keys_are_utf8_text_without_control_characters(session: str, accepted: bool) -> None:
    try:
        run = _parse({"input": "hi"}, **{"X-Hermes-Session-Key": session})
    except InvalidRequest as error:
        assert not accepted and error.code == "invalid_session_key"
        return
    assert accepted and run.session_key == session


URL_LIKE = st.text(alphabet="hHtTpPsS:/.@#?[]%-_aZ09 \t\n\u00aa\uff0f", max_size=12)


@settings(max_examples=2_000)
@given(st.sampled_from(["http://", "https://", "HTTP://", " http://", ""]).flatmap(lambda s: URL_LIKE.map(s.__add__)))
def test_the_plain_url_shortcut_only_takes_urls_the_full_check_takes(url: str) -> None:
    if _PLAIN_URL.match(url):
        assert url_problem(url) is None


@pytest.mark.parametrize(
    ("url", "plain"),
    [("https://git.example.com/group/x/-/merge_requests/1", True), ("http://h:8080", True),
     ("http://h?q", True), ("HTTP://h/", False), ("http://u@h/", False), ("http://[::1]/", False),
     ("http://h\t/", False), ("http:///p", False)],
)  # fmt: skip
def test_common_urls_take_the_shortcut_and_the_rest_the_full_check(url: str, plain: bool) -> None:
    assert bool(_PLAIN_URL.match(url)) is plain


def _input_of_size(size: int) -> str:
    """An input whose execution body `{"input":"..."}` is exactly `size` bytes."""
    return "x" * (size - len(b'{"input":""}'))


def test_an_execution_body_at_the_limit_is_a_create_and_one_byte_more_is_413_naming_the_limit() -> None:
    assert len(parse_create(orjson.dumps({"input": _input_of_size(1000)}), {}, max_body=1000).body) == 1000
    with pytest.raises(BodyTooLarge) as caught:
        parse_create(orjson.dumps({"input": _input_of_size(1001)}), {}, max_body=1000)
    error = caught.value
    assert (error.status, error.code, error.type) == (413, "body_too_large", "invalid_request_error")
    assert "1000 bytes" in caught.value.message and "HERMES_MAX_BODY" in caught.value.message
    assert "1001" in caught.value.message


def test_the_limit_measures_the_body_sent_to_hermes_not_the_request() -> None:
    # Broker-only and unknown fields are never sent: they do not count
    padded = {"input": _input_of_size(1000), "context": {"title": "t" * 500}, "ignored": "y" * 5000}
    assert len(parse_create(orjson.dumps(padded), {}, max_body=1000).body) == 1000
    # The request's own spelling does not count either: the body is measured as it is serialised for Hermes
    spaced = b'{ "input" :  "' + _input_of_size(1000).encode() + b'" ,  "model" : null }'
    assert len(parse_create(spaced, {}, max_body=1000).body) == 1000
    # Every forwarded field counts
    with pytest.raises(BodyTooLarge):
        parse_create(orjson.dumps({"input": _input_of_size(1000), "model": "m"}), {}, max_body=1000)
    history = [{"role": "user", "content": "h" * 2000}]
    with pytest.raises(BodyTooLarge):
        parse_create(orjson.dumps({"input": "hi", "conversation_history": history}), {}, max_body=1000)


def test_a_malformed_create_is_a_400_before_its_size_is_judged() -> None:
    with pytest.raises(InvalidRequest):
        parse_create(orjson.dumps({"input": 5, "instructions": "i" * 2000}), {}, max_body=1000)
