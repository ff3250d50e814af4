"""Standard Webhooks signatures of board deliveries (SPEC S5.7). Pure: no IO, no clock; the caller gives the time.

`webhook-id` is `<key>:<at>`, the same for every delivery of one version (first delivery, retries, replays), so
a receiver can use it as its dedup key. `webhook-timestamp` is the attempt's time in whole epoch seconds, and
`webhook-signature` holds one `v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>` per configured key,
space-separated, so a receiver holding any one of them (old or new, during a rotation) verifies the delivery.
The body is signed as sent, byte for byte; nothing here changes it.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

SIGNATURE_VERSION = "v1"  #: Standard Webhooks' symmetric (HMAC-SHA256) scheme


def webhook_id(key: str, at_ms: int) -> str:
    """The message id of one board version: the same for every delivery of it."""
    return f"{key}:{at_ms}"


def signature(secret: bytes, message_id: str, timestamp_s: int, body: bytes) -> str:
    """One `v1,<base64>` signature of the body under one key."""
    signed = b"%s.%d.%s" % (message_id.encode(), timestamp_s, body)
    digest = hmac.new(secret, signed, hashlib.sha256).digest()
    return f"{SIGNATURE_VERSION},{base64.b64encode(digest).decode()}"


def signed_headers(secrets: tuple[bytes, ...], message_id: str, timestamp_s: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers of one delivery attempt; none without secrets (signing is off)."""
    if not secrets:
        return {}
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp_s),
        "webhook-signature": " ".join(signature(secret, message_id, timestamp_s, body) for secret in secrets),
    }
