"""Signed board deliveries (SPEC S5.7), checked against the official `standardwebhooks` package (a verifier
written elsewhere): it accepts our headers, refuses a tampered body, id or timestamp, and accepts either key
during a rotation."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from datetime import UTC, datetime

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from broker.board.signing import signature, signed_headers, webhook_id

KEY_A, KEY_B, KEY_C = bytes(range(24)), bytes(range(100, 132)), b"\x07" * 64
BODY = orjson.dumps(
    {
        "key": "runs-job_0123",
        "platform": "runs",
        "state": "running",
        "title": "Review \u00e9t\u00e9",
        "at": 1796005750862,
    }
)
MESSAGE_ID = "runs-job_0123:1796005750862"
Tamper = Callable[[bytes, dict[str, str]], tuple[bytes, dict[str, str]]]
#: standardwebhooks 1.1.0 refuses a `webhook-timestamp` more than 5 minutes from its own clock either way
TOLERANCE_S = 5 * 60


def whsec(key: bytes) -> str:
    """The secret as an operator writes it into BOARD_SIGNING_SECRET and a receiver into its library."""
    return "whsec_" + base64.b64encode(key).decode()


def now_s() -> int:
    return int(time.time())


def test_the_reference_verifier_accepts_our_headers_and_returns_the_body() -> None:
    headers = signed_headers((KEY_A,), MESSAGE_ID, now_s(), BODY)
    assert set(headers) == {"webhook-id", "webhook-timestamp", "webhook-signature"}
    assert headers["webhook-id"] == MESSAGE_ID and headers["webhook-timestamp"].isdigit()
    assert Webhook(whsec(KEY_A)).verify(BODY, headers) == orjson.loads(BODY)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda body, headers: (body.replace(b'"running"', b'"done"'), headers),
        lambda body, headers: (body + b" ", headers),
        lambda body, headers: (body, {**headers, "webhook-id": "runs-job_0123:1796005750863"}),
        lambda body, headers: (body, {**headers, "webhook-timestamp": str(int(headers["webhook-timestamp"]) + 1)}),
    ],
    ids=["state", "trailing-space", "id", "timestamp"],
)
def test_a_tampered_body_id_or_timestamp_fails(tamper: Tamper) -> None:
    headers = signed_headers((KEY_A,), MESSAGE_ID, now_s(), BODY)
    body, changed = tamper(BODY, headers)
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(whsec(KEY_A)).verify(body, changed)


def test_another_key_fails() -> None:
    headers = signed_headers((KEY_A,), MESSAGE_ID, now_s(), BODY)
    with pytest.raises(WebhookVerificationError, match="No matching signature"):
        Webhook(whsec(KEY_B)).verify(BODY, headers)


def test_rotation_two_keys_sign_and_a_receiver_holding_either_one_verifies() -> None:
    # Given BOARD_SIGNING_SECRET="<old> <new>"
    headers = signed_headers((KEY_A, KEY_B), MESSAGE_ID, now_s(), BODY)
    # Then the signature header holds one v1 signature per key, in the configured order
    assert [part.split(",")[0] for part in headers["webhook-signature"].split(" ")] == ["v1", "v1"]
    # and a receiver that still has the old key, or already the new one, accepts; a third key does not
    assert Webhook(whsec(KEY_A)).verify(BODY, headers) == orjson.loads(BODY)
    assert Webhook(whsec(KEY_B)).verify(BODY, headers) == orjson.loads(BODY)
    with pytest.raises(WebhookVerificationError):
        Webhook(whsec(KEY_C)).verify(BODY, headers)


def test_without_keys_there_are_no_headers() -> None:
    assert signed_headers((), MESSAGE_ID, now_s(), BODY) == {}


def test_the_timestamp_window_is_the_verifiers_and_each_attempt_carries_its_own_time() -> None:
    # A delivery is signed with the time of its attempt: a replay of an hours-old version verifies,
    signed_now = signed_headers((KEY_A,), MESSAGE_ID, now_s(), BODY)
    assert Webhook(whsec(KEY_A)).verify(BODY, signed_now) == orjson.loads(BODY)
    # while a captured delivery resent later than the verifier's tolerance (5 minutes) is refused by it
    captured = signed_headers((KEY_A,), MESSAGE_ID, now_s() - TOLERANCE_S - 60, BODY)
    with pytest.raises(WebhookVerificationError, match="too old"):
        Webhook(whsec(KEY_A)).verify(BODY, captured)


def test_the_id_is_key_and_at() -> None:
    assert webhook_id("runs-job_0123", 1796005750862) == MESSAGE_ID
    assert "." not in MESSAGE_ID  # Standard Webhooks: the signed id must not contain the separator


@given(
    key=st.binary(min_size=24, max_size=64),
    message_id=st.from_regex(r"runs-job_[0-9a-f]{1,32}:[0-9]{1,13}", fullmatch=True),
    timestamp_s=st.integers(min_value=0, max_value=2**33),
    text=st.text(),
)
def test_our_signature_is_the_reference_one_for_any_key_id_time_and_body(
    key: bytes, message_id: str, timestamp_s: int, text: str
) -> None:
    # (the reference signs the body as text and encodes it as UTF-8: the bytes we send)
    reference = Webhook(key).sign(message_id, datetime.fromtimestamp(timestamp_s, tz=UTC), text)
    assert signature(key, message_id, timestamp_s, text.encode()) == reference
