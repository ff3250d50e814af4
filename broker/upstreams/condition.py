"""What an upstream's state reads as to an operator (SPEC S10: `/readyz`, `/metrics`, the console). Pure; no IO.

Two records say how an upstream is: its shared health (broker/upstreams/health.py: do calls to it get an answer?)
and the last refusal of a create that its admission state keeps (why Hermes did not take one). The refusal is
written when a create is refused and cleared when one is accepted or a run's slot comes back, so it can outlive
what it describes: an upstream killed while it answered 429 takes no create for a while, and its stored refusal
goes on saying "busy". What is shown therefore comes from the health first, and a refusal counts only while no
failed call came after it:
- `lost` / `unreachable`: calls to it fail (the health says since when), whatever refusal is stored (a lone
  upstream, never lost, shows the words of a create it refused since then);
- `busy`: Hermes answered 429 and nothing failed since, or the broker's admission limit is reached;
- `refusing`: Hermes answers but refuses creates (draining, a 5xx, 401/403);
- `up`: none of these.
"""

from __future__ import annotations

import datetime
from enum import StrEnum

from attrs import frozen

from broker.events import HoldReason
from broker.upstreams.health import Health, Reach, reach


class Condition(StrEnum):
    UP = "up"  #: it answers and takes creates
    BUSY = "busy"  #: Hermes answers 429, or the broker's live runs on it reached its limit
    REFUSING = "refusing"  #: Hermes answers, but refuses creates (draining, a 5xx, 401/403)
    UNREACHABLE = "unreachable"  #: calls to it get no answer (refused, reset, timed out)
    LOST = "lost"  #: calls to it got no answer for HERMES_UPSTREAM_LOST: its runs move to the others


@frozen(kw_only=True)
class Refusal:
    """The refusal an upstream's admission state keeps (reason None: none)."""

    reason: HoldReason | None = None
    detail: str = ""
    since_ms: int = 0  #: when the refusals began
    at_ms: int = 0  #: the latest refusal (0: not kept; the start of the refusals counts then)
    retry_at_ms: int = 0  #: when the next probe may go


@frozen(kw_only=True)
class Shown:
    """An upstream as shown: its condition, and the refusal its figures carry (reason None: it takes creates)."""

    condition: Condition
    refusing: HoldReason | None = None
    detail: str = ""
    since_ms: int = 0
    retry_at_ms: int = 0


def shown(
    name: str, refusal: Refusal, health: Health, live: int, limit: int, now_ms: int, lost_ms: int, probe_at_ms: int = 0
) -> Shown:
    """The condition of the upstream `name` at `now_ms`. With `lost_ms` 0 (a lone upstream: nothing to move its runs
    to) it is never lost, but reads unreachable while calls to it fail like any other."""
    reached = reach(health, now_ms, lost_ms) if lost_ms > 0 else (Reach.UNREACHABLE if health.failing else Reach.UP)
    refused_since = refusal.reason is HoldReason.UNAVAILABLE and (
        max(refusal.at_ms, refusal.since_ms) >= health.failing_since_ms
    )
    if reached is not Reach.UP and lost_ms <= 0 and refused_since:
        # a create the lone upstream refused since its calls began to fail says why in the broker's words ("Hermes
        # refused the connection."), and its next create is its probe
        return Shown(
            condition=Condition.UNREACHABLE,
            refusing=HoldReason.UNAVAILABLE,
            detail=refusal.detail,
            since_ms=refusal.since_ms,
            retry_at_ms=refusal.retry_at_ms,
        )
    if reached is not Reach.UP:
        lost = reached is Reach.LOST
        detail = f"Hermes {name} {'is lost: it has' if lost else 'has'} not answered since {_time(health)}."
        return Shown(
            condition=Condition.LOST if lost else Condition.UNREACHABLE,
            refusing=HoldReason.UNAVAILABLE,
            detail=detail,
            since_ms=health.failing_since_ms,
            retry_at_ms=max(probe_at_ms, now_ms),
        )
    current = refusal.reason is not None and not (
        refusal.reason is HoldReason.BUSY and health.failed_ms > max(refusal.at_ms, refusal.since_ms)
    )
    if current and refusal.reason is not None:
        condition = Condition.BUSY if refusal.reason is HoldReason.BUSY else Condition.REFUSING
        return Shown(
            condition=condition,
            refusing=refusal.reason,
            detail=refusal.detail,
            since_ms=refusal.since_ms,
            retry_at_ms=refusal.retry_at_ms,
        )
    if live >= limit:
        return Shown(condition=Condition.BUSY, detail=capacity_detail(limit, name))
    return Shown(condition=Condition.UP)


def capacity_detail(limit: int, upstream: str | None = None) -> str:
    where = f"Hermes {upstream}" if upstream else "Hermes"
    return f"{where} is at capacity ({limit} live run{'' if limit == 1 else 's'})."


def _time(health: Health) -> str:
    """When its calls began to fail, as a UTC time (seconds)."""
    moment = datetime.datetime.fromtimestamp(health.failing_since_ms / 1000, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
