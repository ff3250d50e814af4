"""Strict parsing of create and approval requests into commands (SPEC S3.1, S3.5). Every failure names the
offending path."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import orjson

from broker.admission.fair import PRIORITIES, SchedulingRequest
from broker.callbacks.hosts import CallbackRefused, parse_callback
from broker.config import MULTITASK
from broker.config_values import MAX_FAIRNESS_WEIGHT
from broker.errors import BodyTooLarge, InvalidRequest
from broker.events import Context, Link, Reporting
from broker.ids import fingerprint
from broker.jobs.commands import ApprovalChoice, CreateRun

_FORWARDED_STRINGS = ("instructions", "previous_response_id", "model")
MAX_KEY_LENGTH = 255
MAX_SESSION_KEY_LENGTH = 256
MAX_TITLE = 500
MAX_LINKS = 10
MAX_LINK_TEXT = 100
MAX_URL = 2048
MAX_FAIRNESS_KEY = 64
#: A plain http(s) URL: lowercase scheme, an ASCII host name without user info, an optional port, then a path,
#: query, fragment or nothing. Every such URL passes the full check (`url_problem`), which this only saves.
_NOT_IN_URL = re.compile(r"[\x00-\x20\x7f]")
_PLAIN_URL = re.compile(r"https?://[A-Za-z0-9.-]+(?::[0-9]*)?(?:[/?#]|\Z)")


def parse_create(
    raw: bytes, headers: Mapping[str, str], *, max_body: int, callback_hosts: tuple[str, ...] = ()
) -> CreateRun:
    """The create command of a POST /v1/runs; InvalidRequest naming the offending path, BodyTooLarge when the
    execution body, as it is sent to Hermes, is over `max_body` bytes. `callback_hosts`: CALLBACK_ALLOWED_HOSTS."""
    idempotency_key = parse_idempotency_key(headers.get("Idempotency-Key"))
    session_key = parse_session_key(headers.get("X-Hermes-Session-Key"))
    payload = _json_object(raw)
    body = _execution_body(payload)
    scheduling = parse_scheduling(payload["scheduling"]) if "scheduling" in payload else SchedulingRequest()
    history = parse_session_history(payload.get("session_history"), body, scheduling)
    callback_url = _callback(payload["callback"], callback_hosts) if payload.get("callback") is not None else None
    # These bytes are stored with the job and sent to Hermes unchanged on every attempt: their size is the size
    # of every create the job makes (a session's history, SPEC S4.3, comes on top).
    execution_body = orjson.dumps(body)
    if len(execution_body) > max_body:
        raise BodyTooLarge(len(execution_body), max_body)
    return CreateRun(
        body=execution_body,
        fingerprint=fingerprint(body["input"], body.get("instructions")),
        idempotency_key=idempotency_key,
        session_key=session_key,
        session_id=body.get("session_id"),
        model=body.get("model"),
        context=parse_context(payload.get("context")) if "context" in payload else None,
        reporting=parse_reporting(payload.get("reporting")) if "reporting" in payload else Reporting(),
        scheduling=scheduling,
        session_history=history,
        callback_url=callback_url,
    )


def _callback(value: Any, hosts: tuple[str, ...]) -> str:
    try:
        return parse_callback(value, hosts)
    except CallbackRefused as refused:
        raise InvalidRequest("invalid_callback", str(refused), param=refused.path) from None


def parse_idempotency_key(value: str | None) -> str | None:
    if value is None:
        return None
    if not 1 <= len(value) <= MAX_KEY_LENGTH or not all(0x21 <= ord(c) <= 0x7E for c in value):
        raise InvalidRequest(
            "invalid_idempotency_key",
            "Idempotency-Key must be 1-255 visible ASCII characters without spaces",
            param="Idempotency-Key",
        )
    return value


def parse_session_key(value: str | None) -> str | None:
    """At most 256 characters of text without control characters (C0, DEL, C1). Non-ASCII text is a key like any
    other: stored and forwarded as UTF-8. Bytes that are not UTF-8 reach here as lone surrogates (the server
    decodes headers with `surrogateescape`) and are refused: they could be neither stored nor forwarded."""
    if not value:
        return None
    if len(value) > MAX_SESSION_KEY_LENGTH or any(_not_text(c) for c in value):
        raise InvalidRequest(
            "invalid_session_key",
            "X-Hermes-Session-Key must be at most 256 characters of UTF-8 text without control characters",
            param="X-Hermes-Session-Key",
        )
    return value


def _not_text(char: str) -> bool:
    code = ord(char)
    return code < 0x20 or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xDFFF


def _json_object(raw: bytes) -> dict[str, Any]:
    try:
        payload = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise InvalidRequest("invalid_json", "Request body must be valid JSON") from None
    if not isinstance(payload, dict):
        raise InvalidRequest("invalid_json", "Request body must be a JSON object")
    return payload


def _execution_body(payload: dict[str, Any]) -> dict[str, Any]:
    """The forwarded fields, validated; null counts as absent; unknown fields are dropped."""
    body: dict[str, Any] = {"input": _input(payload.get("input"))}
    for name in _FORWARDED_STRINGS:
        if payload.get(name) is not None:
            body[name] = _string(payload[name], name)
    if payload.get("session_id") is not None:
        session_id = _string(payload["session_id"], "session_id")
        if not 1 <= len(session_id) <= MAX_SESSION_KEY_LENGTH:
            raise InvalidRequest("invalid_field", "session_id must be 1-256 characters", param="session_id")
        body["session_id"] = session_id
    if payload.get("conversation_history") is not None:
        body["conversation_history"] = _messages(payload["conversation_history"], "conversation_history")
    return body


def _input(value: Any) -> str | list[Any]:
    if value is None or value == [] or (isinstance(value, str) and not value.strip()):
        raise InvalidRequest("missing_input", "input is required and must not be empty", param="input")
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise InvalidRequest("invalid_input", "input must be a string or an array of messages", param="input")
    try:
        messages = _messages(value, "input")
    except InvalidRequest as exc:
        raise InvalidRequest("invalid_input", exc.message, param=exc.param) from None
    if not _has_text(messages[-1]["content"]):
        raise InvalidRequest("invalid_input", f"input[{len(value) - 1}].content must not be empty", param="input")
    return messages


def _messages(value: Any, name: str) -> list[Any]:
    if not isinstance(value, list):
        raise InvalidRequest("invalid_field", f"{name} must be an array of message objects", param=name)
    for index, message in enumerate(value):
        path = f"{name}[{index}]"
        if not isinstance(message, dict) or "role" not in message or "content" not in message:
            raise InvalidRequest("invalid_field", f"{path} must have 'role' and 'content' fields", param=path)
        if not isinstance(message["role"], str):
            raise InvalidRequest("invalid_field", f"{path}.role must be a string", param=f"{path}.role")
        if not isinstance(message["content"], str | list):
            raise InvalidRequest(
                "invalid_field", f"{path}.content must be a string or an array", param=f"{path}.content"
            )
    return value


def _has_text(content: str | list[Any]) -> bool:
    if isinstance(content, str):
        return bool(content.strip())
    texts = (part.get("text") for part in content if isinstance(part, dict))
    return any(isinstance(text, str) and text.strip() for text in texts)


def _string(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise InvalidRequest("invalid_field", f"{name} must be a string", param=name)
    return value


def parse_context(value: Any) -> Context:
    if not isinstance(value, dict):
        raise _context("context", "must be an object")
    title = value.get("title")
    if not isinstance(title, str) or not 1 <= len(title) <= MAX_TITLE or not title.strip():
        raise _context("context.title", "must be a non-blank string of 1-500 characters")
    url = _url(value["url"], "context.url") if value.get("url") is not None else None
    links = _links(value["links"]) if value.get("links") is not None else None
    return Context(title=title, url=url, links=links)


def _links(value: Any) -> tuple[Link, ...]:
    if not isinstance(value, list) or len(value) > MAX_LINKS:
        raise _context("context.links", "must be an array of at most 10 links")
    links = []
    for index, link in enumerate(value):
        path = f"context.links[{index}]"
        if not isinstance(link, dict):
            raise _context(path, "must be an object with text and url")
        text = link.get("text")
        if not isinstance(text, str) or not 1 <= len(text) <= MAX_LINK_TEXT or not text.strip():
            raise _context(f"{path}.text", "must be a non-blank string of 1-100 characters")
        links.append(Link(text=text, url=_url(link.get("url"), f"{path}.url")))
    return tuple(links)


def _url(value: Any, path: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_URL:
        raise _context(path, "must be an http or https URL of at most 2048 characters")
    if _NOT_IN_URL.search(value):  # urlsplit would drop some of them, and judge another URL than the one stored
        raise _context(path, "must not contain spaces or control characters")
    problem = None if _PLAIN_URL.match(value) else url_problem(value)
    if problem is not None:
        raise _context(path, problem)
    return value


def url_problem(value: str) -> str | None:
    """What is wrong with a URL by S3.1.2 (scheme http or https, a host, no user info), or None."""
    try:
        parts = urlsplit(value)
        host, user, password = parts.hostname, parts.username, parts.password
    except ValueError:
        return "must be an http or https URL"
    if parts.scheme not in ("http", "https") or not host:
        return "must be an http or https URL"
    if user is not None or password is not None:
        return "must not contain a username or password"
    return None


def _context(path: str, rule: str) -> InvalidRequest:
    return InvalidRequest("invalid_context", f"{path} {rule}", param=path)


def parse_reporting(value: Any) -> Reporting:
    if not isinstance(value, dict):
        raise InvalidRequest("invalid_reporting", "reporting must be an object", param="reporting")
    flags: dict[str, bool] = {}
    for name in ("board", "post"):
        if name in value:
            if type(value[name]) is not bool:
                path = f"reporting.{name}"
                raise InvalidRequest("invalid_reporting", f"{path} must be a boolean", param=path)
            flags[name] = value[name]
    return Reporting(**flags)


def parse_session_history(value: Any, body: Mapping[str, Any], scheduling: SchedulingRequest) -> bool | None:
    """`session_history` (SPEC S4.3): a boolean; `true` needs a `session_id` and a turn that waits its turn
    (`enqueue`; a create that names no multitask is checked against the default when the job is made), and takes
    the place of the caller's own history."""
    if value is None:
        return None
    if not isinstance(value, bool):
        raise InvalidRequest("invalid_field", "session_history must be a boolean", param="session_history")
    if not value:
        return False
    if "session_id" not in body:
        raise _history_conflict("session_history needs a session_id")
    if scheduling.multitask not in (None, "enqueue"):
        raise _history_conflict("session_history needs scheduling.multitask enqueue")
    for name in ("conversation_history", "previous_response_id"):
        if name in body:
            raise _history_conflict(f"session_history cannot be combined with {name}")
    return True


def _history_conflict(message: str) -> InvalidRequest:
    return InvalidRequest("invalid_field", message, param="session_history")


def parse_scheduling(value: Any) -> SchedulingRequest:
    """`scheduling` (SPEC S4.2): null counts as a wrong value, anywhere; unknown fields inside are ignored."""
    if not isinstance(value, dict):
        raise _scheduling("scheduling", "must be an object")
    priority = value.get("priority")
    if "priority" in value and (type(priority) is not int or priority not in PRIORITIES):
        raise _scheduling("scheduling.priority", "must be an integer from 1 to 5")
    key = value.get("fairness_key")
    if "fairness_key" in value and (
        not isinstance(key, str)
        or not 1 <= len(key) <= MAX_FAIRNESS_KEY
        or not all(0x21 <= ord(c) <= 0x7E for c in key)
    ):
        raise _scheduling("scheduling.fairness_key", "must be 1-64 visible ASCII characters")
    weight = value.get("fairness_weight")
    if "fairness_weight" in value and (
        not isinstance(weight, int | float) or isinstance(weight, bool) or not 0 < weight <= MAX_FAIRNESS_WEIGHT
    ):  # NaN fails the comparison
        raise _scheduling("scheduling.fairness_weight", "must be a number greater than 0 and at most 1000")
    multitask = value.get("multitask")
    if "multitask" in value and multitask not in MULTITASK:
        raise _scheduling("scheduling.multitask", "must be one of enqueue, reject, interrupt, parallel")
    return SchedulingRequest(
        priority=priority,
        fairness_key=key,
        fairness_weight=None if weight is None else float(weight),
        multitask=multitask,
    )


def _scheduling(path: str, rule: str) -> InvalidRequest:
    return InvalidRequest("invalid_scheduling", f"{path} {rule}", param=path)


_CHOICES = {
    "once": "once",
    "session": "session",
    "always": "always",
    "deny": "deny",
    "approve": "once",
    "approved": "once",
    "allow": "once",
}
_TRUE = ("true", "1", "yes", "on")
APPROVAL_CHOICES = tuple(_CHOICES)  #: what `choice` may be (case-insensitive)


def parse_approval(raw: bytes, *, allow_always: bool) -> ApprovalChoice:
    """The approval command of a POST /v1/runs/{id}/approval."""
    payload = _json_object(raw)
    value = payload.get("choice")
    choice = _CHOICES.get(value.strip().lower()) if isinstance(value, str) else None
    if choice is None:
        raise InvalidRequest(
            "invalid_approval_choice",
            "Invalid approval choice; expected one of: once, session, always, deny",
            param="choice",
        )
    if choice == "always" and not allow_always:
        raise InvalidRequest(
            "approval_choice_not_allowed",
            "choice 'always' changes Hermes's allow-list for every future run and is not allowed here",
            param="choice",
        )
    flag = payload.get("all", payload.get("resolve_all", False))
    resolve_all = flag is True or (isinstance(flag, str) and flag.strip().lower() in _TRUE)
    return ApprovalChoice(choice=choice, resolve_all=resolve_all)
