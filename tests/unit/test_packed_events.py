"""Packed stored entries (broker/codec.py, SPEC S3.6): exactly the event back, frames byte for byte the same."""

from __future__ import annotations

import orjson
from hypothesis import given
from hypothesis import strategies as st

from broker.codec import Packed, encode, pack, read_entry
from broker.events import HermesEventRecorded, UnknownEvent
from broker.http.hub import frames
from tests.strategies import JOB_ID, at_ms, attempts, hermes_event, json_text, run_ids

NAMES = st.sampled_from(["message.delta", "tool.started", "tool.completed", "reasoning.available", "todo.updated"])
stamps = st.one_of(
    st.floats(min_value=0, max_value=4e9, allow_nan=False),
    st.integers(min_value=-5, max_value=2**62),
    st.sampled_from([1796005750.8501606, 1796005750.850504, 0.0, -1.5, 1e300, True, None, "soon"]),
)
extras = st.dictionaries(st.sampled_from(["tool", "preview", "duration", "error", "text", "x"]), st.text(max_size=6))


@st.composite
def hermes_shaped(draw: st.DrawFn) -> HermesEventRecorded:
    """Events as Hermes sends them (`event`, `run_id`, `timestamp`, then the rest) and every way to differ."""
    name, run_id = draw(NAMES), draw(run_ids)
    document: dict[str, object] = {"event": draw(st.sampled_from([name, name, "other.name"]))}
    document["run_id"] = draw(st.sampled_from([run_id, run_id, "run_elsewhere"]))
    if draw(st.booleans()):
        document["timestamp"] = draw(stamps)
    if name == "message.delta" and draw(st.booleans()):
        document["delta"] = draw(st.text(max_size=12))
    else:
        document.update(draw(extras))
    if draw(st.integers(0, 9)) == 0:  # another key order
        document = dict(reversed(list(document.items())))
    return HermesEventRecorded(
        job_id=JOB_ID,
        at_ms=draw(at_ms),
        attempt=draw(attempts),
        hermes_run_id=run_id,
        name=name,
        payload=orjson.dumps(document).decode(),
    )


events = st.one_of(hermes_shaped(), hermes_event())


def _unpacked(data: bytes, run_id: str) -> object:
    read = read_entry(data, JOB_ID)
    assert isinstance(read, Packed)
    return read.complete(run_id)


@given(events)
def test_a_packed_entry_reads_as_exactly_the_event(event: HermesEventRecorded) -> None:
    packed = pack(event)
    if packed is not None:
        assert _unpacked(packed, event.hermes_run_id) == event
        assert len(packed) < len(encode(event))


@given(events, st.sampled_from(["1796005747391-0", "1796005750862-17"]))
def test_frames_are_byte_identical_from_full_and_packed_storage(event: HermesEventRecorded, entry_id: str) -> None:
    packed = pack(event)
    full = read_entry(encode(event), JOB_ID)
    assert full == event  # a full entry, new or stored by an older broker, reads as before
    if packed is not None:
        from_packed = _unpacked(packed, event.hermes_run_id)
        assert isinstance(from_packed, HermesEventRecorded)
        assert frames(JOB_ID, [(entry_id, from_packed)]) == frames(JOB_ID, [(entry_id, event)])


@given(at_ms, attempts, run_ids, st.floats(min_value=1e9, max_value=4e9, allow_nan=False), st.text(max_size=12))
def test_a_hermes_delta_always_packs_to_its_text_and_a_few_bytes(
    at: int, attempt: int, run_id: str, stamp: float, text: str
) -> None:
    payload = orjson.dumps({"event": "message.delta", "run_id": run_id, "timestamp": stamp, "delta": text}).decode()
    event = HermesEventRecorded(
        job_id=JOB_ID, at_ms=at, attempt=attempt, hermes_run_id=run_id, name="message.delta", payload=payload
    )
    packed = pack(event)
    assert packed is not None
    assert len(packed) <= len(orjson.dumps(text)) + len(orjson.dumps(stamp)) + 12 + len(
        str(abs(at - round(stamp * 1000)))
    )
    assert JOB_ID.encode() not in packed and run_id.encode() not in packed


@given(json_text)
def test_malformed_packed_entries_read_as_unknown(text: str) -> None:
    for data in ("[" + text + "]", "[1]", '[1,"x",2]', '[true,1,2,"p"]', '[1,99,2,"p"]', "[1,1,2,5]"):
        read = read_entry(data, JOB_ID)
        got = read.complete("run_a") if isinstance(read, Packed) else read
        assert isinstance(got, HermesEventRecorded | UnknownEvent)


def test_an_unknown_run_reads_as_unknown() -> None:
    event = HermesEventRecorded(
        job_id=JOB_ID,
        at_ms=1,
        attempt=1,
        hermes_run_id="run_a",
        name="message.delta",
        payload='{"event":"message.delta","run_id":"run_a","timestamp":1.5,"delta":"x"}',
    )
    packed = pack(event)
    assert packed is not None
    read = read_entry(packed, JOB_ID)
    assert isinstance(read, Packed) and read.complete(None) == UnknownEvent()
