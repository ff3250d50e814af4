"""The event and view codecs: exact round trips, lenient decoding of what a replica cannot read."""

from __future__ import annotations

from typing import Any, get_args

import attrs
import orjson
import pytest
from cattrs.preconf.orjson import make_converter
from hypothesis import given
from hypothesis import strategies as st

from broker.codec import decode, decode_view, encode, encode_view, to_builtins
from broker.events import JobCreated, JobEvent, Scheduling, UnknownEvent
from projections.job import JobView, fold
from tests.strategies import any_event, by_type, histories

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
EVENT_TYPES = [cls.__name__ for cls in get_args(JobEvent) if cls is not UnknownEvent]


@given(any_event())
def test_every_event_round_trips(event: JobEvent) -> None:
    assert decode(encode(event)) == event
    assert decode(encode(event).decode()) == event


@given(any_event())
def test_the_type_tag_is_the_class_name(event: JobEvent) -> None:
    document = orjson.loads(encode(event))
    assert document["type"] == type(event).__name__
    assert to_builtins(event) == document


@given(any_event())
def test_a_stored_event_leaves_out_its_defaults_and_reads_as_one_stored_in_full(event: JobEvent) -> None:
    stored = orjson.loads(encode(event))
    defaults = {a.name: a.default for a in attrs.fields(type(event)) if a.default is not attrs.NOTHING}
    assert not any(name in defaults and defaults[name] == value for name, value in stored.items())
    if not isinstance(event, UnknownEvent):  # as an older replica wrote it: every field
        assert decode(orjson.dumps({**attrs.asdict(event), "type": type(event).__name__})) == event


@pytest.mark.parametrize("event_type", get_args(JobEvent), ids=lambda cls: cls.__name__)
@given(data=st.data())
def test_each_event_type_round_trips(event_type: type, data: st.DataObject) -> None:
    event = data.draw(by_type()[event_type])
    assert type(event) is event_type
    assert decode(encode(event)) == event


@given(any_event(), st.dictionaries(st.text(min_size=1).filter(lambda k: k != "type"), json_values, max_size=3))
def test_extra_fields_are_ignored(event: JobEvent, extra: dict[str, Any]) -> None:
    document = to_builtins(event)
    stored = {**{key: value for key, value in extra.items() if key not in document}, **document}
    assert decode(orjson.dumps(stored)) == event


@given(any_event(), st.text().filter(lambda tag: tag not in EVENT_TYPES))
def test_an_unknown_type_decodes_as_unknown_event(event: JobEvent, tag: str) -> None:
    document = {**to_builtins(event), "type": tag}
    assert decode(orjson.dumps(document)) == UnknownEvent()


@given(st.binary())
def test_garbage_bytes_never_raise(data: bytes) -> None:
    assert isinstance(decode(data), get_args(JobEvent))


@given(json_values)
def test_any_json_that_is_not_an_event_decodes_as_unknown_event(value: Any) -> None:
    assert decode(orjson.dumps(value)) == UnknownEvent()


def test_a_known_type_with_missing_or_wrong_fields_is_unknown() -> None:
    assert decode(b'{"type":"JobCreated"}') == UnknownEvent()
    assert decode(b'{"type":"JobHeld","job_id":"j","at_ms":1,"reason":"nope","retry_at_ms":2}') == UnknownEvent()
    assert decode(b'{"type":"RunAccepted","job_id":"j","at_ms":1,"attempt":[],"hermes_run_id":"r"}') == UnknownEvent()


def test_a_legacy_create_without_reporting_keeps_both_flags() -> None:
    legacy = b'{"type":"JobCreated","job_id":"job_1","at_ms":1,"body":"{}","fingerprint":"f"}'
    event = decode(legacy)
    assert isinstance(event, JobCreated)
    assert (event.reporting.board, event.reporting.post, event.context) == (True, True, None)


def test_a_create_stored_before_scheduling_reads_as_the_default_and_the_default_is_not_stored() -> None:
    legacy = b'{"type":"JobCreated","job_id":"job_1","at_ms":1,"body":"{}","fingerprint":"f"}'
    event = decode(legacy)
    assert isinstance(event, JobCreated) and event.scheduling == Scheduling()
    assert (event.scheduling.priority, event.scheduling.fairness_key, event.scheduling.fairness_weight) == (3, "", 1.0)
    assert "scheduling" not in orjson.loads(encode(event))
    keyed = JobCreated(job_id="j", at_ms=1, body="{}", fingerprint="f", scheduling=Scheduling(fairness_key="a"))
    assert orjson.loads(encode(keyed))["scheduling"] == {"fairness_key": "a"}  # its defaults left out too
    view = fold([keyed])
    assert view is not None and view.scheduling == Scheduling(fairness_key="a")


@given(histories())
def test_every_view_round_trips(events: list[JobEvent]) -> None:
    view = fold(events)
    assert view is not None
    assert decode_view(encode_view(view)) == view
    assert decode_view(encode_view(view).decode()) == view


def test_a_stored_view_leaves_out_the_fields_at_their_defaults() -> None:
    created = JobCreated(job_id="job_1", at_ms=1, body='{"input":"x"}', fingerprint="f")
    view = fold([created])
    assert view is not None
    stored = orjson.loads(encode_view(view))
    assert set(stored) == {"job_id", "status", "created_at_ms", "updated_at_ms", "fingerprint"}
    # and a view written in full by an older replica reads the same
    assert decode_view(orjson.dumps(attrs.asdict(view))) == view


@given(st.binary() | json_values.map(orjson.dumps))
def test_an_unreadable_view_is_none(data: bytes) -> None:
    decoded = decode_view(data)
    assert decoded is None or isinstance(decoded, JobView)


def test_a_view_with_missing_fields_is_none() -> None:
    assert decode_view(b'{"job_id":"job_1"}') is None
    assert decode_view(b"") is None


def test_a_job_created_by_an_untraced_broker_reads_without_a_trace_context() -> None:
    # Given a JobCreated as today's main (and any broker without tracing) stores it
    stored = b'{"job_id":"job_1","at_ms":1,"body":"{}","fingerprint":"f","type":"JobCreated"}'
    # Then it reads with no trace context, and an untraced create stores exactly those bytes again
    event = decode(stored)
    assert isinstance(event, JobCreated) and event.traceparent is None
    assert encode(event) == stored


def test_an_older_replica_reads_a_traced_job_created() -> None:
    # Given a JobCreated stored with its trace context (SPEC S6.1)
    traced = JobCreated(
        job_id="job_1", at_ms=1, body="{}", fingerprint="f", traceparent="00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    )
    stored = encode(traced)
    # When a replica whose JobCreated has no such field (the class as main had it) decodes it
    fields = [a for a in attrs.fields(JobCreated) if a.name != "traceparent"]
    older_class = attrs.make_class(
        "JobCreated", {a.name: attrs.field(default=a.default, kw_only=True) for a in fields}, frozen=True
    )
    older = make_converter(omit_if_default=True)
    # Then it reads every other field unchanged (cattrs ignores the field it does not know)
    read = older.loads(orjson.dumps({k: v for k, v in orjson.loads(stored).items() if k != "type"}), older_class)
    assert attrs.asdict(read) == {k: v for k, v in attrs.asdict(traced).items() if k != "traceparent"}
