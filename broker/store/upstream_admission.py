"""Each upstream's admission keys and figures (SPEC S10): which slot holds an upstream's limit, live slots and
refusal, and how their figures read. The first upstream's are today's `{adm}` keys (broker/store/keys.py)."""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen

from broker.admission.state import INITIAL_LIMIT, UpstreamFigures
from broker.events import HoldReason
from broker.store import keys
from broker.upstreams import Upstream

_REASONS = frozenset(reason.value for reason in HoldReason)


@frozen
class UpstreamSlots:
    """Where one upstream's admission lives, and its pinned limit (HERMES_MAX_CONCURRENT; 0 = learnt)."""

    name: str
    keys: keys.AdmissionKeys
    pinned: int = 0


def slots_of(upstreams: Sequence[Upstream]) -> tuple[UpstreamSlots, ...]:
    """The admission slots of the configured upstreams, in HERMES_URL order."""
    return tuple(UpstreamSlots(u.name, keys.admission(u.name, first=u.index == 0), u.max_concurrent) for u in upstreams)


def figures(upstream: UpstreamSlots, state: dict[str, str], live: int) -> UpstreamFigures:
    """An upstream's figures from its state hash and its count of live slots."""
    refusing = state.get("refusing", "")
    return UpstreamFigures(
        name=upstream.name,
        limit=upstream.pinned or int(state.get("limit") or INITIAL_LIMIT),
        learnt=upstream.pinned == 0,
        live=live,
        refusing=HoldReason(refusing) if refusing in _REASONS else None,
        detail=state.get("detail", ""),
        since_ms=int(state.get("since") or 0),
        retry_at_ms=int(state.get("retry_at") or 0),
        probes=int(state.get("probes") or 0),
        refused=int(state.get("refused") or 0),
    )
