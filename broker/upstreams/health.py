"""Whether an upstream answers (SPEC S10 "What counts as an answer", "A lost upstream"): one pure model. No IO.

Two values describe an upstream's health, kept per replica (`Heard`, what this replica's own calls met) and
shared by the replicas (`Health`, in the upstream's admission state, merged by upstream_heard.lua with the same
rule as `merge` here):
- `answered_ms`: when Hermes last answered a call of any replica (any status with Hermes's envelope or run
  object, a stream event or keepalive);
- `failing_since_ms`: when the current streak of calls that got no answer began (a refused or reset connection, a
  timeout, a 502/503/504 without Hermes's envelope); 0 while the last call was answered.

An upstream is `UP` while not failing, `UNREACHABLE` while failing, and `LOST` once it has failed without a single
answer for HERMES_UPSTREAM_LOST. One failed call after an idle hour starts a streak (it is not lost), and any
answer in between (a run's stream event) ends it, so a brief refusal while a run streams never loses it. An
upstream that never answered since the broker started is lost like any other after a whole window of failures.

Routing, affinity, the probes, the lost rule and `/readyz` read this state and nothing else.
"""

from __future__ import annotations

from enum import StrEnum

from attrs import evolve, frozen


class Reach(StrEnum):
    UP = "up"  #: its last call was answered (or it was never called)
    UNREACHABLE = "unreachable"  #: calls to it fail, for less than HERMES_UPSTREAM_LOST so far
    LOST = "lost"  #: calls to it have failed, without an answer, for HERMES_UPSTREAM_LOST


@frozen
class Health:
    """An upstream's health as the replicas share it."""

    answered_ms: int = 0  #: the latest answer any replica got (0: none known)
    failing_since_ms: int = 0  #: when the current streak of failures began (0: not failing)
    failed_ms: int = 0  #: the latest failed call of any replica

    @property
    def failing(self) -> bool:
        return self.failing_since_ms > 0


@frozen
class Heard:
    """What one replica's own calls to one upstream met, to be merged into the shared `Health`."""

    answered_ms: int = 0  #: its latest answer
    failing_since_ms: int = 0  #: when its calls began to fail after its latest answer (0: its last call was answered)
    failed_ms: int = 0  #: when its latest failed call began

    @property
    def failing(self) -> bool:
        return self.failing_since_ms > 0


def answered(heard: Heard, at_ms: int) -> Heard:
    """A call (or a stream) got an answer at `at_ms`: the streak of failures, if any, is over."""
    return Heard(answered_ms=max(heard.answered_ms, at_ms))


def failed(heard: Heard, started_ms: int) -> Heard:
    """A call begun at `started_ms` got no answer: a streak begins (or goes on)."""
    if started_ms < heard.answered_ms:
        started_ms = heard.answered_ms  # it failed after an answer that came while it was on its way
    since = heard.failing_since_ms or started_ms
    return evolve(heard, failing_since_ms=since, failed_ms=max(heard.failed_ms, started_ms))


def merge(shared: Health, heard: Heard) -> Health:
    """The shared health after one replica's report (the rule upstream_heard.lua keeps).

    The latest answer wins; a streak that began before it is over. A failure after the latest answer (of any
    replica) is a streak that counts from its earliest known start, at the latest from the latest failure; so a
    replica that alone keeps failing (the others idle) finds the upstream lost a window after that, and the
    replicas' reports may arrive in any order.
    """
    answered_ms = max(shared.answered_ms, heard.answered_ms)
    failed_ms = max(shared.failed_ms, heard.failed_ms)
    began = [at for at in (shared.failing_since_ms, heard.failing_since_ms) if at > answered_ms]
    since = min(began) if began else (failed_ms if failed_ms > answered_ms else 0)
    return Health(answered_ms=answered_ms, failing_since_ms=since, failed_ms=failed_ms)


def reach(health: Health, now_ms: int, lost_ms: int) -> Reach:
    """UP, UNREACHABLE, or LOST after HERMES_UPSTREAM_LOST of failures without an answer, as routing reads it; always
    UP when `lost_ms` is 0 (a lone upstream: nothing to route around, nowhere to move its runs to). What a lone
    upstream shows an operator (unreachable while its calls fail) is broker/upstreams/condition.py's."""
    if not health.failing or lost_ms <= 0:
        return Reach.UP
    return Reach.LOST if now_ms - health.failing_since_ms >= lost_ms else Reach.UNREACHABLE


def is_lost(health: Health, now_ms: int, lost_ms: int) -> bool:
    return reach(health, now_ms, lost_ms) is Reach.LOST


def parse(
    answered_ms: str | bytes | None, failing_since_ms: str | bytes | None, failed_ms: str | bytes | None = None
) -> Health:
    """The shared health from its stored fields (absent or empty: 0). A streak that began before the stored answer is
    over (a replica of an earlier broker stores answers without ending streaks)."""
    answered, since = _int(answered_ms), _int(failing_since_ms)
    return Health(answered_ms=answered, failing_since_ms=since if since > answered else 0, failed_ms=_int(failed_ms))


#: The first probes of an upstream whose calls began to fail go this soon after each other: a brief refusal is over
#: (and the upstream takes work again) within a fraction of a second.
FIRST_PROBE_GAP_MS = 250


def probe_gap(health: Health, now_ms: int, interval_ms: int) -> int:
    """How long after a probe of a failing upstream the next one may go: a quarter of how long it has been failing,
    from FIRST_PROBE_GAP_MS up to `interval_ms`; so a brief fault is found over at once and a long one costs a probe
    per interval."""
    failing_for = max(0, now_ms - health.failing_since_ms) if health.failing else 0
    return max(min(FIRST_PROBE_GAP_MS, interval_ms), min(interval_ms, failing_for // 4))


def report_due(heard: Heard, reported: Heard, shared: Health, refresh_ms: int = 0) -> bool:
    """Should this replica write its record now? When its streak began, began anew or ended; when an answer of its
    own would end the streak the shared state shows (whatever it met since); when it fails and the shared state does
    not know it; and, with `refresh_ms`, when its latest answer is that much newer than the shared one (an earlier
    broker judges an upstream by the stored answer's age alone)."""
    if heard.failing != reported.failing:
        return True
    if shared.failing and heard.answered_ms > shared.failing_since_ms:
        return True
    if heard.failing:
        return heard.failing_since_ms != reported.failing_since_ms or not shared.failing
    return refresh_ms > 0 and heard.answered_ms - max(reported.answered_ms, shared.answered_ms) >= refresh_ms


def _int(raw: str | bytes | None) -> int:
    if raw is None or raw in ("", b""):
        return 0
    try:
        return int(float(raw))
    except ValueError:
        return 0
