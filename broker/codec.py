"""Bytes <-> events. Stored events decode leniently: unknown fields are ignored and unknown
`type` tags become `UnknownEvent`, so old and new replicas can share streams.

Fields at their defaults are left out of what is stored, so a default is part of the stored format: it never
changes, and a field that has none never gets one (every version of broker/events.py so far keeps to this;
a replica that reads an event without the field then reads the same value). `JobCreated.scheduling` (SPEC S4.2)
is such a field: an event written before it, or with the defaults (priority 3, key "", weight 1.0), stores none,
and reads as those defaults; an older replica ignores it. A stored view likewise (`JobView.scheduling`)."""

from __future__ import annotations

from typing import Any, TypeVar, cast

from cattrs import BaseValidationError
from cattrs.preconf.orjson import OrjsonConverter, make_converter
from cattrs.strategies import configure_tagged_union

from broker.events import JobEvent, UnknownEvent
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
