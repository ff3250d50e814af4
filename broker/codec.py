"""Bytes <-> events. Stored events decode leniently: unknown fields are ignored and unknown
`type` tags become `UnknownEvent`, so old and new replicas can share streams.

Fields at their defaults are left out of what is stored, so a default is part of the stored format: it never
changes, and a field that has none never gets one (every version of broker/events.py so far keeps to this;
a replica that reads an event without the field then reads the same value). `JobCreated.scheduling` (SPEC S4.2)
is such a field: an event written before it, or with the defaults (priority 3, key "", weight 1.0), stores none,
and reads as those defaults; an older replica ignores it. A stored view likewise (`JobView.scheduling`).

**Packed entries** (SPEC S3.6). A run relays one `HermesEventRecorded` per chunk of its answer, and each one,
stored as a full event, repeats what every event of the attempt shares: the job id, the Hermes run id, the
attempt, the `type` tag, and inside Hermes's payload the event name and the run id again. A packed entry is a
JSON array `[attempt, name, at, body...]` that leaves those out: the reader knows the job id from the stream's
key and the run id of the attempt from the job's view hash (`run:<attempt>`, written by the same job write,
broker/store/entries.py). `name` is a small code for the common names (`PACKED_NAMES`, never reordered) or the
name itself; the body is `ts, text` for a `message.delta` of Hermes's usual shape, the rest of Hermes's payload
(an object) when it starts with `event` and `run_id` as Hermes sends it, else the payload text itself; `at` is
the offset of the record time from Hermes's `timestamp` when the payload has one, else the record time. An
event is packed only when unpacking gives exactly the event back (`pack` checks it), so the SSE frames, the
folds and the rebuild see byte for byte what a full entry gives; everything else is stored in full.

Why a replica of this version does not always pack (the rolling upgrade). A broker before this version reads
a packed entry as `UnknownEvent` (its tagged union gets an array; nothing raises), and its feed hides unknown
events: its SSE clients would silently miss the deltas and the tool events of jobs driven by new replicas,
and a client resuming elsewhere would not get them back (its last id is past them). No packed form avoids
that, because the old decoder requires `job_id`, `hermes_run_id` and `attempt` in every entry, and those are
what packing leaves out. So packing is a store-wide switch (`broker/store/entries.py`, key `hbr:format`):
off on a store an older broker has written, until `python scripts/event_format.py packed` says every replica
reads packed entries (after the rollout); on from the start on a store no broker has used yet and on the
embedded Redis (one broker only), unless an operator pinned it `full`. Full entries, old or new, always read
the same."""

from __future__ import annotations

from typing import Any, TypeVar, cast

import orjson
from attrs import frozen
from cattrs import BaseValidationError
from cattrs.preconf.orjson import OrjsonConverter, make_converter
from cattrs.strategies import configure_tagged_union

from broker.events import HermesEventRecorded, JobEvent, UnknownEvent
from projections.board import BoardState
from projections.job import JobView

event_codec: OrjsonConverter = make_converter(omit_if_default=True)
configure_tagged_union(
    JobEvent,
    event_codec,
    tag_generator=lambda cls: cls.__name__,
    tag_name="type",
    default=UnknownEvent,
)


def encode(event: JobEvent) -> bytes:
    return event_codec.dumps(event, unstructure_as=JobEvent)


def decode(data: bytes | str) -> JobEvent:
    try:
        return cast(JobEvent, event_codec.loads(data, JobEvent))  # type: ignore[arg-type]
    except (BaseValidationError, ValueError, TypeError, KeyError):
        # a stored event this replica cannot read folds as a no-op
        return UnknownEvent()


#: Codes of the common Hermes event names in packed entries: the index + 1. Append only, never reorder.
PACKED_NAMES = ("message.delta", "tool.started", "tool.completed", "reasoning.available")
_DELTA = "message.delta"
_MAX_TS = 2**53 // 1000  #: a larger Hermes `timestamp` is junk: the record time is stored as it is


@frozen
class Packed:
    """A packed entry as read, waiting for its attempt's Hermes run id (`complete`)."""

    job_id: str
    attempt: int
    name: str
    at: int  #: the record time, or its offset from Hermes's `timestamp` (`_base`)
    body: tuple[Any, ...]

    def complete(self, run_id: str | None) -> JobEvent:
        """The event, given the run id of its attempt (None: unknown, the entry reads as UnknownEvent)."""
        if run_id is None:
            return UnknownEvent()
        try:
            payload, base = _payload(self.name, run_id, self.body)
        except (TypeError, ValueError, OverflowError):
            return UnknownEvent()
        return HermesEventRecorded(
            job_id=self.job_id,
            at_ms=self.at + (base or 0),
            attempt=self.attempt,
            hermes_run_id=run_id,
            name=self.name,
            payload=payload,
        )


def pack(event: HermesEventRecorded) -> bytes | None:
    """The packed entry of `event`, or None when it does not pack exactly (then it is stored in full)."""
    name = PACKED_NAMES.index(event.name) + 1 if event.name in PACKED_NAMES else event.name
    body = _body(event)
    base = _base(body)
    packed = orjson.dumps([event.attempt, name, event.at_ms - (base or 0), *body])
    back = read_entry(packed, event.job_id)
    return packed if isinstance(back, Packed) and _reads_back(back, event) else None


def _reads_back(back: Packed, event: HermesEventRecorded) -> bool:
    """`back.complete(event.hermes_run_id) == event` (the same job id by construction), without making the event."""
    try:
        payload, base = _payload(back.name, event.hermes_run_id, back.body)
    except (TypeError, ValueError, OverflowError):
        return False
    return (
        back.attempt == event.attempt
        and back.name == event.name
        and back.at + (base or 0) == event.at_ms
        and payload == event.payload
    )


def read_entry(data: bytes | str, job_id: str) -> JobEvent | Packed:
    """A stored entry of `job_id`'s stream: a full event, or a packed one that needs its run id."""
    if not data or (data[0] != "[" and data[0] != ord("[")):
        return decode(data)
    try:
        value = orjson.loads(data)
        attempt, name, at, *body = value
        if isinstance(name, int) and not isinstance(name, bool):
            name = PACKED_NAMES[name - 1] if 1 <= name <= len(PACKED_NAMES) else None
        if not (_is_int(attempt) and _is_int(at) and isinstance(name, str) and body):
            return UnknownEvent()
    except (ValueError, TypeError):
        return UnknownEvent()
    return Packed(job_id, attempt, name, at, tuple(body))


def _body(event: HermesEventRecorded) -> list[Any]:
    try:
        document = orjson.loads(event.payload)
    except ValueError:
        return [event.payload]
    if not isinstance(document, dict) or list(document)[:2] != ["event", "run_id"]:
        return [event.payload]
    if document["event"] != event.name or document["run_id"] != event.hermes_run_id:
        return [event.payload]
    rest = {key: value for key, value in document.items() if key not in ("event", "run_id")}
    if event.name == _DELTA and list(rest) == ["timestamp", "delta"]:
        return [rest["timestamp"], rest["delta"]]
    return [rest]


def _payload(name: str, run_id: str, body: tuple[Any, ...]) -> tuple[str, int | None]:
    """(payload text, the ms `at` is an offset from, if any) of a packed body."""
    match body:
        case (str() as text,):
            return text, None
        case (dict() as rest,):
            return orjson.dumps({"event": name, "run_id": run_id, **rest}).decode(), _base(body)
        case (stamp, str() as delta) if name == _DELTA:
            document = {"event": name, "run_id": run_id, "timestamp": stamp, "delta": delta}
            return orjson.dumps(document).decode(), _base(body)
    raise ValueError("not a packed body")


def _base(body: list[Any] | tuple[Any, ...]) -> int | None:
    """Hermes's `timestamp` in ms when the packed body has a usable one: `at` is stored as an offset from it."""
    match body:
        case (dict() as rest,):
            stamp = rest.get("timestamp")
        case (stamp, str()):
            pass
        case _:
            return None
    if isinstance(stamp, bool) or not isinstance(stamp, int | float) or not 0 <= stamp < _MAX_TS:
        return None
    return round(stamp * 1000)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def to_builtins(event: JobEvent) -> dict[str, Any]:
    return cast(dict[str, Any], event_codec.unstructure(event, unstructure_as=JobEvent))


#: Projections are caches of the streams (refolded when unreadable), stored the same way.
view_codec: OrjsonConverter = make_converter(omit_if_default=True)
_Stored = TypeVar("_Stored", JobView, BoardState)


def encode_view(view: JobView) -> bytes:
    return view_codec.dumps(view)


def decode_view(data: bytes | str) -> JobView | None:
    """A stored view, or None when this replica cannot read it (the caller refolds the stream)."""
    return _stored(data, JobView)


def encode_board(state: BoardState) -> bytes:
    return view_codec.dumps(state)


def decode_board(data: bytes | str) -> BoardState | None:
    """A stored board fold state, or None when this replica cannot read it (the caller refolds)."""
    return _stored(data, BoardState)


def _stored(data: bytes | str, cls: type[_Stored]) -> _Stored | None:
    try:
        return view_codec.loads(data, cls)
    except (BaseValidationError, ValueError, TypeError, KeyError):
        return None
