"""Pure decoding of Hermes's `text/event-stream` lines into events and comments. No IO."""

from __future__ import annotations

import orjson

from broker.hermes.models import Comment, HermesEvent


class SseDecoder:
    """Feeds chunks or single lines; a blank line dispatches the `data:` lines collected since the last one.

    Hermes 0.19.0 writes only `data: <json>` frames and `: comment` lines (no `event:` or `id:`), but the
    decoder follows the SSE rules so multi-line data and CRLF endings decode too. A frame whose data is not
    a JSON object is dropped: it carries no event name we could pass on.
    """

    def __init__(self) -> None:
        self._data: list[bytes] = []
        self._partial = b""

    def feed_chunk(self, chunk: bytes) -> list[HermesEvent | Comment]:
        """Everything the chunk completes; a trailing partial line waits for the next chunk."""
        *lines, self._partial = (self._partial + chunk).split(b"\n")
        return [item for line in lines if (item := self.feed(line)) is not None]

    def feed(self, line: bytes) -> HermesEvent | Comment | None:
        line = line.rstrip(b"\r\n")
        if not line:
            return self._dispatch()
        if line.startswith(b":"):
            return Comment(line[1:].strip().decode("utf-8", "replace"))
        field, _, value = line.partition(b":")
        if field == b"data":
            self._data.append(value[1:] if value.startswith(b" ") else value)
        return None  # `event:`, `id:`, `retry:` and unknown fields carry nothing Hermes uses

    def _dispatch(self) -> HermesEvent | None:
        if not self._data:
            return None
        data, self._data = b"\n".join(self._data), []
        return decode_event(data)


def decode_event(data: bytes) -> HermesEvent | None:
    """The event of one frame's data, named by its `event` field; None when it is not a JSON object."""
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(payload, dict):
        return None
    name = payload.get("event")
    return HermesEvent(name if isinstance(name, str) else "", payload)
