"""Each upstream's admission keys and figures (SPEC S10): which slot holds an upstream's limit, live slots and
refusal, and how their figures read. The first upstream's are today's `{adm}` keys (broker/store/keys.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from attrs import frozen

from broker.admission import fair
from broker.admission.route import UNTIL_LOST, Need, Standing
from broker.admission.state import INITIAL_LIMIT, UpstreamFigures
from broker.events import HoldReason
from broker.store import keys
from broker.upstreams import Upstream
from broker.upstreams.condition import Refusal, shown
from broker.upstreams.health import Reach, parse, reach
from projections.job import JobView

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


def figures(upstream: UpstreamSlots, state: dict[str, str], live: int, now_ms: int, lost_ms: int) -> UpstreamFigures:
    """An upstream's figures from its state hash and its count of live slots; what it refuses and why is its
    current condition (broker/upstreams/condition.py), never a refusal that calls failing since made stale."""
    stored = state.get("refusing", "")
    health = parse(state.get("answered"), state.get("failing"), state.get("failed"))
    limit = upstream.pinned or int(state.get("limit") or INITIAL_LIMIT)
    refusal = Refusal(
        reason=HoldReason(stored) if stored in _REASONS else None,
        detail=state.get("detail", ""),
        since_ms=_ms(state.get("since")),
        at_ms=_ms(state.get("refused_at")),
        retry_at_ms=_ms(state.get("retry_at")),
    )
    now = shown(upstream.name, refusal, health, live, limit, now_ms, lost_ms, _ms(state.get("probe_at")))
    return UpstreamFigures(
        name=upstream.name,
        limit=limit,
        learnt=upstream.pinned == 0,
        live=live,
        refusing=now.refusing,
        detail=now.detail,
        since_ms=now.since_ms,
        retry_at_ms=now.retry_at_ms,
        probes=int(state.get("probes") or 0),
        refused=int(state.get("refused") or 0),
        condition=now.condition,
        lost=reach(health, now_ms, lost_ms) is Reach.LOST,
        unreachable_since_ms=health.failing_since_ms,
    )


def _ms(raw: str | None) -> int:
    return int(float(raw)) if raw else 0


@frozen
class Reserved:
    """One upstream's answer to a pass's reservation (admission_admit.lua)."""

    upstream: UpstreamSlots
    wake_at_ms: int  #: when its next probe may go while it refuses (0: none)
    virtual: list[int]  #: V per priority as its state keeps it (read from the first upstream's only)
    standing: Standing  #: what routing reads (SPEC S10)
    reservations: list[str]
    probing: bool = True  #: it refused as the reservation was made: one reservation may be its probe


def reserved(upstream: UpstreamSlots, reply: list[str], now_ms: int, lost_ms: int) -> Reserved:
    """Parse `{wake_at, v1..v5, limit, in_use, refusing, since, answered, failing, reservation...}`."""
    refusing = reply[8]
    health = parse(reply[10], reply[11])
    standing = Standing(
        name=upstream.name,
        limit=int(reply[6]),
        in_use=int(reply[7]),
        free=len(reply) - 12,
        refusing=HoldReason(refusing) if refusing in _REASONS else None,
        refusing_since_ms=int(reply[9] or 0),
        lost=reach(health, now_ms, lost_ms) is Reach.LOST,
        failing_since_ms=health.failing_since_ms if lost_ms > 0 else 0,
    )
    return Reserved(
        upstream, int(reply[0]), [int(float(tag)) for tag in reply[1:6]], standing, reply[12:], refusing != ""
    )


def need_of(view: JobView | None, first: str, affinities: Mapping[str, str], grace_ms: int) -> Need:
    """What routing needs of a claimed job (SPEC S10):
    - a create whose answer was lost is bound to its upstream until that one is lost (its run may be live there;
      the replay with the same key goes there);
    - a resubmit (attempt n > 1) is bound to its interrupted run's upstream (the first for a run accepted before
      S10), to go elsewhere as soon as that one is down;
    - a first attempt of a session with an affinity is bound to that upstream, to go elsewhere after `grace_ms` of
      it being down."""
    if view is None:
        return Need()
    if view.unanswered_on is not None:  # its create's answer was lost there: its run may be live there
        return Need(bound=view.unanswered_on, patience_ms=UNTIL_LOST)
    if view.attempt > 1:
        return Need(bound=view.upstream or first, patience_ms=0)
    if view.session_id is not None and view.session_id in affinities:
        return Need(bound=affinities[view.session_id], patience_ms=grace_ms)
    return Need()


def grant_calls(
    answers: Sequence[Reserved],
    routed: dict[str, list[tuple[str, str]]],
    now_ms: int,
    slot_ttl_ms: int,
    moved: Mapping[int, int] | None = None,
) -> list[tuple[list[str], list[str | int]]]:
    """One admission_grant.lua call per upstream: its jobs (job, place) with its reservations, the unused ones
    back; the first upstream's call also moves V past the places of the jobs granted on the others, and to where
    the pass `moved` it (priority -> V: as the place one tag before)."""
    calls: list[tuple[list[str], list[str | int]]] = []
    elsewhere = [place for answer in answers[1:] for _, place in routed.get(answer.upstream.name, [])]
    elsewhere += [str(fair.score(priority, tag - 1)) for priority, tag in (moved or {}).items() if tag > 0]
    for index, answer in enumerate(answers):
        jobs = routed.get(answer.upstream.name, [])
        if not answer.reservations and not (index == 0 and elsewhere):
            continue
        triples: list[str | int] = []
        for reservation, (job_id, place) in zip(answer.reservations, jobs, strict=False):
            triples += [reservation, job_id, place]
        unused = answer.reservations[len(jobs) :]
        others: list[str] = elsewhere if index == 0 else []
        calls.append(
            (
                answer.upstream.keys.reserving,
                [
                    now_ms,
                    slot_ttl_ms,
                    len(jobs),
                    len(unused),
                    "1" if answer.probing else "0",
                    *triples,
                    *unused,
                    *others,
                ],
            )
        )
    return calls
