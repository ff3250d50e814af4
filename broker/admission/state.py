"""The admission line's state as the replicas share it, and what it means for a waiting job. Pure; no IO.

The Redis side (the line, the slots, the learnt limit, the refusal) is in `broker/store/admission.py`
and its scripts; this module only reads the figures they keep.
"""

from __future__ import annotations

from attrs import frozen

from broker.admission import fair
from broker.admission.route import Need
from broker.events import HoldReason
from broker.upstreams.condition import Condition, capacity_detail
from projections.job import Hold, JobView

__all__ = ["INITIAL_LIMIT", "QUIET_MS", "LineState", "UpstreamFigures", "capacity_detail", "line_place", "shown_hold"]

#: Where a learnt limit starts (slow start): small, so a first burst of a backlog never floods Hermes.
INITIAL_LIMIT = 2
#: How long the limit stays unchanged, without a 429, before it grows by one past the known capacity.
QUIET_MS = 2_000


@frozen(kw_only=True)
class UpstreamFigures:
    """One upstream's admission at one moment (SPEC S10: `/readyz` `admission.upstreams`, `/metrics`)."""

    name: str
    limit: int
    learnt: bool
    live: int
    refusing: HoldReason | None = None  #: it takes no create: Hermes refuses them, or calls to it fail
    detail: str = ""  #: what its condition is, in a sentence (empty: up)
    since_ms: int = 0
    retry_at_ms: int = 0
    probes: int = 0
    refused: int = 0
    condition: Condition = Condition.UP  #: at a glance (broker/upstreams/condition.py)
    lost: bool = False  #: calls to it failed, without an answer, for HERMES_UPSTREAM_LOST (SPEC S10)
    unreachable_since_ms: int = 0  #: when calls to it began to fail (0: its last call was answered)

    @property
    def full(self) -> bool:
        return self.live >= self.limit


@frozen(kw_only=True)
class LineState:
    """The shared admission figures at one moment (SPEC S3.8 `/readyz`, S4.1)."""

    limit: int  #: most live runs of the broker's on Hermes
    learnt: bool  #: False: pinned by HERMES_MAX_CONCURRENT
    live: int  #: runs (and creates in flight) holding an admission slot
    waiting: int  #: jobs in the line
    oldest_wait_ms: int | None  #: how long the oldest queued job has waited (by the listing's queued index)
    refusing: HoldReason | None = None  #: Hermes refuses creates (the last refusal's reason)
    detail: str = ""  #: the last refusal's words
    since_ms: int = 0  #: when the refusal began
    retry_at_ms: int = 0  #: when the next probe may go
    probes: int = 0  #: probes sent while Hermes refused (a counter)
    refused: int = 0  #: creates Hermes refused (a counter)
    by_priority: tuple[int, ...] = (0,) * len(fair.PRIORITIES)  #: first attempts waiting, per priority (S4.2)
    ahead: int = 0  #: waiting ahead of every priority: resubmits, and jobs an older broker placed
    keys: tuple[fair.KeyLoad, ...] = ()  #: the fairness keys with the most waiting jobs
    #: every upstream's own figures, in HERMES_URL order (SPEC S10); the fields above are the first's
    upstreams: tuple[UpstreamFigures, ...] = ()
    session_waiting: int = 0  #: turns waiting for an earlier turn of their session (SPEC S4.3)
    scheduled: int = 0  #: jobs in the due schedules: every job not finished, driven or waiting (with the lines)

    @property
    def full(self) -> bool:
        return self.live >= self.limit


def shown_hold(view: JobView, line: LineState, now_ms: int, need: Need | None = None) -> Hold | None:
    """The `hold` a waiting job shows (SPEC S3.2): the line's refusal or its full limit, with the job's own `since`.

    A job in the line writes nothing while it waits; what it shows is derived from the line, so a
    thousand held jobs cost no write per backoff period. With several upstreams (SPEC S10) a job bound to one
    (`need`: its session's, or its interrupted run's) shows that upstream's hold while it waits for it.
    """
    if view.status.terminal or view.accepted_attempt == view.attempt:
        return None
    since = view.hold.since_ms if view.hold is not None else view.updated_at_ms
    if len(line.upstreams) > 1:
        bound = _waited_for(line.upstreams, need, now_ms)
        if bound is not None:
            return _upstream_hold(bound, since, now_ms)
        return _fleet_hold(line.upstreams, since, now_ms)
    if line.refusing is not None:
        return Hold(line.refusing, since, max(line.retry_at_ms, since), line.detail or None)
    if line.full:
        return Hold(HoldReason.BUSY, since, max(now_ms, since), capacity_detail(line.limit))
    return None


def _waited_for(upstreams: tuple[UpstreamFigures, ...], need: Need | None, now_ms: int) -> UpstreamFigures | None:
    """The upstream a bound job waits for (as `route` decides): its own while busy, or down within its patience."""
    if need is None or need.bound is None:
        return None
    bound = next((u for u in upstreams if u.name == need.bound), None)
    if bound is None or bound.lost:
        return None
    down = bound.refusing is not None and bound.refusing is not HoldReason.BUSY
    if down and now_ms - bound.since_ms >= need.patience_ms:
        return None  # it goes elsewhere (or, with nowhere else, takes the probe the fleet's hold shows)
    return bound


def _upstream_hold(upstream: UpstreamFigures, since: int, now_ms: int) -> Hold | None:
    if upstream.refusing is not None:
        return Hold(upstream.refusing, since, max(upstream.retry_at_ms, since), upstream.detail or None)
    if upstream.full:
        return Hold(HoldReason.BUSY, since, max(now_ms, since), capacity_detail(upstream.limit, upstream.name))
    return None


def _fleet_hold(upstreams: tuple[UpstreamFigures, ...], since: int, now_ms: int) -> Hold | None:
    """With several upstreams (SPEC S10) a job waits while none of them can take it: every one refusing shows the
    refusal whose probe comes first; every one full or refusing, busy with the upstreams' whole capacity."""
    refusing = [u for u in upstreams if u.refusing is not None]
    if len(refusing) == len(upstreams):
        first = min(refusing, key=lambda u: u.retry_at_ms)
        assert first.refusing is not None
        return Hold(first.refusing, since, max(first.retry_at_ms, since), first.detail or None)
    if all(u.full or u.refusing is not None for u in upstreams):
        capacity = sum(u.limit for u in upstreams if u.refusing is None)
        return Hold(HoldReason.BUSY, since, max(now_ms, since), capacity_detail(capacity))
    return None


def line_place(view: JobView) -> str:
    """The job's score in the admission line (SPEC S4.1, S4.2) when the line lost the one it was given: a resubmit
    by its created ms (ahead of every first attempt); a first attempt at the front of its priority's band (its
    start tag was taken in its key's turn at create, fair.py; a lost one is not computed again)."""
    return str(fair.front(view.scheduling.priority) if view.attempt == 1 else view.created_at_ms)
