"""SseDecoder: Hermes's data-only frames, comments, and frames split across chunks."""

from __future__ import annotations

from broker.hermes.models import Comment, HermesEvent
from broker.hermes.sse import SseDecoder, decode_event

FRAME = b'data: {"event": "message.delta", "run_id": "run_1", "timestamp": 1.5, "delta": "Hi"}\n\n'


def test_a_data_frame_becomes_an_event_with_its_payload_unchanged() -> None:
    [event] = SseDecoder().feed_chunk(FRAME)
    assert event == HermesEvent(
        "message.delta", {"event": "message.delta", "run_id": "run_1", "timestamp": 1.5, "delta": "Hi"}
    )


def test_comments_pass_through_without_their_colon() -> None:
    assert SseDecoder().feed_chunk(b": keepalive\n\n: stream closed\n\n") == [
        Comment("keepalive"),
        Comment("stream closed"),
    ]


def test_frames_split_at_any_byte_decode_the_same() -> None:
    stream = FRAME + b": keepalive\n\n" + FRAME.replace(b"\n", b"\r\n")
    whole = SseDecoder().feed_chunk(stream)
    for cut in range(1, len(stream)):
        decoder = SseDecoder()
        assert decoder.feed_chunk(stream[:cut]) + decoder.feed_chunk(stream[cut:]) == whole
    assert len(whole) == 3


def test_multi_line_data_is_joined_and_other_fields_are_ignored() -> None:
    chunk = b'event: x\nid: 7\ndata: {"event":\ndata: "tool.started"}\n\n'
    assert SseDecoder().feed_chunk(chunk) == [HermesEvent("tool.started", {"event": "tool.started"})]


def test_unknown_event_types_pass_through_and_junk_is_dropped() -> None:
    assert decode_event(b'{"event": "subagent.start", "x": 1}') == HermesEvent(
        "subagent.start", {"event": "subagent.start", "x": 1}
    )
    assert decode_event(b'{"no_event": true}') == HermesEvent("", {"no_event": True})
    assert decode_event(b"[1, 2]") is None
    assert decode_event(b"not json") is None
