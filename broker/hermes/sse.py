"""Hermes's `text/event-stream`: pure decoding of lines into events and comments, and the reading loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import orjson

from broker.hermes.models import Comment, HermesEvent, StreamEnded, StreamItem


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


async def read_stream(response: aiohttp.ClientResponse, idle_timeout_s: float) -> AsyncIterator[StreamItem]:
    """Events and comments until Hermes closes the stream, it breaks, or no event came for `idle_timeout_s`.

    Only `data:` frames reset the idle timer: a stream orphaned upstream sends keepalives forever.
    """
    loop = asyncio.get_running_loop()
    decoder = SseDecoder()
    clean = closed = False
    deadline = loop.time() + idle_timeout_s
    try:
        while not closed:
            try:
                async with asyncio.timeout_at(deadline):
                    chunk = await response.content.readany()
            except TimeoutError:
                break
            if not chunk:
                break
            for item in decoder.feed_chunk(chunk):
                if isinstance(item, HermesEvent):
                    deadline = loop.time() + idle_timeout_s
                    clean = clean or item.terminal
                closed = isinstance(item, Comment) and item.text == "stream closed"
                clean = clean or closed
                yield item
                if closed:
                    break
    except (aiohttp.ClientError, OSError):
        pass  # a broken connection ends the stream, cleanly only if its end was already seen
    yield StreamEnded(clean)
