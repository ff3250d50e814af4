"""Pure validation of the simulator's request bodies, with Hermes 0.19.0's exact error messages."""

from __future__ import annotations

import orjson
from attrs import frozen

from broker.simulator.wire import JsonObject

DEFAULT_MODEL = "hermes-agent"
CHOICE_ALIASES = {"approve": "once", "approved": "once", "allow": "once"}
CHOICES = ("once", "session", "always", "deny")
INVALID_CHOICE = "Invalid approval choice; expected one of: once, session, always, deny"


@frozen
class CreateRequest:
    """What a create needs from its body: the user message text, session and model."""

    text: str
    session_id: str | None
    model: str


class BodyError(Exception):
    """Raised when a body breaks a rule; the message is Hermes's."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def parse_object(body: bytes) -> JsonObject:
    try:
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        raise BodyError("Invalid JSON") from None
    if not isinstance(value, dict):
        # Hermes 0.19.0 crashes here with a plain-text 500; the simulator answers a 400 on purpose.
        raise BodyError("Request body must be a JSON object")
    return value


def parse_create(body: bytes) -> CreateRequest:
    payload = parse_object(body)
    raw_input = payload.get("input")
    if not raw_input:
        raise BodyError("Missing 'input' field")
    text = _user_text(raw_input)
    if not text:
        raise BodyError("No user message found in input")
    history = payload.get("conversation_history")
    if history:
        if not isinstance(history, list):
            raise BodyError("'conversation_history' must be an array of message objects")
        for index, entry in enumerate(history):
            if not isinstance(entry, dict) or "role" not in entry or "content" not in entry:
                raise BodyError(f"conversation_history[{index}] must have 'role' and 'content' fields")
    session_id = payload.get("session_id")
    model = payload.get("model", DEFAULT_MODEL)
    return CreateRequest(
        text=text,
        session_id=session_id if isinstance(session_id, str) and session_id else None,
        model=model if isinstance(model, str) else DEFAULT_MODEL,
    )


def parse_choice(payload: JsonObject) -> tuple[str, bool]:
    """`(choice, resolve_all)` of an approval body; aliases and case are folded as Hermes does."""
    raw = str(payload.get("choice", "")).strip().lower()
    choice = CHOICE_ALIASES.get(raw, raw)
    if choice not in CHOICES:
        raise BodyError(INVALID_CHOICE, "invalid_approval_choice")
    return choice, _flag(payload.get("all")) or _flag(payload.get("resolve_all"))


def _user_text(raw_input: object) -> str:
    if isinstance(raw_input, str):
        return raw_input
    if not isinstance(raw_input, list) or not isinstance(raw_input[-1], dict):
        return ""
    content = raw_input[-1].get("content", "")
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return content if isinstance(content, str) else ""


def _flag(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes", "on")
    return value is True or value == 1
