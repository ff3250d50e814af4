"""The S2 numbers the driving rules depend on: read by the driver (decide), the board's repair and the wiring."""

from __future__ import annotations

from attrs import frozen

from broker.config import Config


@frozen(kw_only=True)
class Policy:
    """The S2 numbers the rules depend on (milliseconds)."""

    hold_ms: int = 2_400_000
    resubmit: int = 3
    backoff_ms: int = 1_000
    backoff_max_ms: int = 30_000
    events_maxlen: int = 100_000

    @classmethod
    def from_config(cls, config: Config) -> Policy:
        return cls(
            hold_ms=config.runs_hold_ms,
            resubmit=config.runs_resubmit,
            backoff_ms=config.runs_backoff_ms,
            backoff_max_ms=config.runs_backoff_max_ms,
            events_maxlen=config.runs_events_maxlen,
        )
