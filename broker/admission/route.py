"""Which upstream a granted job goes to (SPEC S10): a pure decision, state + job + now -> upstream or wait.

An admission pass reserves slots on every upstream with room (each upstream's own limit, S4.1), then takes the
heads of the line in order and routes each with `route`, which spends one of those slots:
- a job bound to an upstream (its session's, the upstream of its interrupted run, or the one its create's answer
  was lost on) goes there while that upstream is up, and waits while it is busy; once it has been down longer than
  the job's patience (the affinity grace; none for a resubmit; until it is lost for a create whose answer was lost)
  the job goes elsewhere, and the choice says it moved; with nowhere else to go it takes its own upstream's probe,
  as any waiting job would (else a lone down upstream is never probed);
- any other job goes to the upstream with the lowest share of its limit in use among those with a free slot, the
  probe of an upstream that refuses creates but answers first (so it is found up again while others have room),
  a busy one's probe last, then in HERMES_URL order;
- with several upstreams, one whose calls fail (unreachable, or lost) gets no create at all: its health probe
  (broker/driver/prober.py) finds it back; a lone upstream's probe is a create, as S4.1 says;
- no upstream is given more jobs than it has free slots, and no job waits while an upstream it may use has one.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import attrs
from attrs import frozen

from broker.events import HoldReason


@frozen(kw_only=True)
class Standing:
    """One upstream as a pass sees it."""

    name: str
    limit: int  #: its admission limit (>= 1)
    in_use: int  #: its live runs and creates in flight, this pass's grants included
    free: int  #: slots reserved for this pass and not given yet (its room now)
    refusing: HoldReason | None = None  #: it refuses creates (its free slot, if any, is the probe)
    refusing_since_ms: int = 0
    lost: bool = False  #: calls to it failed, without an answer, for HERMES_UPSTREAM_LOST
    failing_since_ms: int = 0  #: calls to it fail since then (0: it answers; broker/upstreams/health.py)

    @property
    def refuses(self) -> bool:
        """It answers, but refuses creates for another reason than being busy (draining, 5xx, 401/403)."""
        return self.refusing is not None and self.refusing is not HoldReason.BUSY

    @property
    def failing(self) -> bool:
        return self.lost or self.failing_since_ms > 0

    @property
    def down(self) -> bool:
        """Refused, unreachable, draining or lost: not merely busy (SPEC S10)."""
        return self.failing or self.refuses

    def down_for(self, now_ms: int) -> int:
        """How long it has been down (0 while up); a lost upstream counts as down for ever."""
        if self.lost:
            return FOREVER
        since = [
            at for at, now in ((self.refusing_since_ms, self.refuses), (self.failing_since_ms, True)) if now and at
        ]
        return max(0, now_ms - min(since)) if since else 0

    @property
    def share(self) -> Fraction:
        return Fraction(self.in_use, max(1, self.limit))


#: Longer than any wait: a lost upstream is down this long, and a job bound "until lost" is this patient.
FOREVER = 1 << 62
UNTIL_LOST = FOREVER - 1


@frozen(kw_only=True)
class Need:
    """What routing needs of a job: the upstream it is bound to, if any, and how long it waits for it while down."""

    #: its session's upstream (affinity), its interrupted run's, or the one its create's answer was lost on
    bound: str | None = None
    #: HERMES_AFFINITY_GRACE for a session; 0 for a resubmit; UNTIL_LOST for a create whose answer was lost
    patience_ms: int = 0


@frozen(kw_only=True)
class Choice:
    upstream: str | None  #: None: the job waits (back to its place in the line)
    #: it was bound to this upstream, down past its patience (or no longer configured); None: it was not moved
    moved_from: str | None = None
    reason: str | None = None  #: why it moved: the bound one's refusal reason, `lost`, or `removed` (not listed)


def route(standings: Sequence[Standing], need: Need, now_ms: int) -> Choice:
    """The upstream of one job, or wait (SPEC S10)."""
    fleet = len(standings) > 1
    bound = next((s for s in standings if s.name == need.bound), None)
    if bound is not None and (not bound.down or bound.down_for(now_ms) < need.patience_ms):
        # up, or down within the job's patience: it waits for its own (a failing one is probed without a job)
        return Choice(upstream=bound.name if _open(bound, fleet) else None)
    best = _best([s for s in standings if s is not bound], fleet)
    if best is None:  # nowhere else to go: its own upstream's probe (its free slot while it refuses) brings it back
        return Choice(upstream=bound.name if bound is not None and _open(bound, fleet) else None)
    if need.bound is None:
        return Choice(upstream=best.name)
    return Choice(upstream=best.name, moved_from=need.bound, reason=_why(bound))  # down too long, or not listed


def take(standings: Sequence[Standing], name: str) -> list[Standing]:
    """The standings after one job went to `name`: one slot less free, one more in use."""
    return [attrs.evolve(s, free=s.free - 1, in_use=s.in_use + 1) if s.name == name else s for s in standings]


def route_all(standings: Sequence[Standing], needs: Sequence[Need], now_ms: int) -> list[Choice]:
    """Route the heads of the line in order, each spending the slot it takes."""
    choices: list[Choice] = []
    current = list(standings)
    for need in needs:
        choice = route(current, need, now_ms)
        if choice.upstream is not None:
            current = take(current, choice.upstream)
        choices.append(choice)
    return choices


def _why(bound: Standing | None) -> str:
    if bound is None:
        return "removed"
    if bound.lost:
        return "lost"
    return bound.refusing.value if bound.refusing is not None else "unavailable"


def _open(standing: Standing, fleet: bool) -> bool:
    """Can it take a create now? A free slot (its probe's while it refuses), and, in a fleet, calls to it answered."""
    return standing.free > 0 and not (fleet and standing.failing)


def _best(standings: Sequence[Standing], fleet: bool) -> Standing | None:
    """The open upstream for an unbound job: the probe of one that refuses but answers (draining, a 5xx, 401/403:
    is it back?) first, then the lowest share in use, a busy one's probe last (others have room), then HERMES_URL
    order."""
    open_ = [(_rank(s), s.share, index, s) for index, s in enumerate(standings) if _open(s, fleet)]
    return min(open_, key=lambda item: item[:3])[3] if open_ else None


def _rank(standing: Standing) -> int:
    if standing.refusing is None:
        return 1
    return 2 if standing.refusing is HoldReason.BUSY else 0
