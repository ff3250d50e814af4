"""When a board key's versions go out (SPEC S5.2, S5.3, S5.6), as pure rules over its stored hash. No IO, no clock."""

from __future__ import annotations

from attrs import field, frozen

from broker.config import Config
from broker.store.board import BoardEntry

#: Slack on top of the longest delivery before a key's lock expires on its own.
LOCK_MARGIN_MS = 5_000


@frozen(kw_only=True)
class DeliverySettings:
    """The S2 settings of delivery (durations in milliseconds)."""

    url: str
    retries: int = 5  #: BOARD_RETRIES: attempts per version
    timeout_ms: int = 10_000  #: BOARD_TIMEOUT: per attempt
    refresh_ms: int = 60_000  #: BOARD_REFRESH_INTERVAL
    backoff_ms: int = 500  #: the pause before the second attempt; doubles after each failure
    backoff_max_ms: int = 8_000
    #: BOARD_SIGNING_SECRET's keys (SPEC S5.7); empty: deliveries carry no signature headers
    secrets: tuple[bytes, ...] = field(default=(), repr=False)

    @classmethod
    def from_config(cls, config: Config) -> DeliverySettings:
        assert config.board_url is not None  # Config.from_env requires it when boards are enabled
        return cls(
            url=config.board_url,
            retries=config.board_retries,
            timeout_ms=config.board_timeout_ms,
            refresh_ms=config.board_refresh_interval_ms,
            secrets=config.board_signing_secrets,
        )

    def backoff(self, failures: int) -> int:
        """The pause (ms) after `failures` failed attempts of one version."""
        return min(self.backoff_max_ms, self.backoff_ms << min(max(0, failures - 1), 30))

    @property
    def lock_ms(self) -> int:
        """A key's lock outlives its longest delivery, so no other replica sends while one still may."""
        pauses = sum(self.backoff(failures) for failures in range(1, self.retries))
        return self.retries * self.timeout_ms + pauses + LOCK_MARGIN_MS


@frozen
class Deliver:
    """Send the pending (latest) version now."""

    at_ms: int


@frozen
class Replay:
    """Send the acknowledged latest version again, byte for byte (reconciliation)."""

    at_ms: int


@frozen
class Later:
    """An activity-only version whose refresh is not due yet: look again at `due_at_ms`."""

    due_at_ms: int


Step = Deliver | Replay | Later | None


def next_step(
    entry: BoardEntry, now_ms: int, refresh_ms: int, *, replay: bool = False, replay_before_ms: int | None = None
) -> Step:
    """What a holder of the key's lock does with it now; None: nothing (nothing pending, or expired)."""
    if entry.expire_at <= now_ms:
        return None  # an expired entry is never delivered or replayed (receivers ignore it anyway)
    if entry.pending_at is not None:
        if entry.pending_change or entry.delivered_ms is None:
            return Deliver(entry.latest_at)  # a state change (or a key never delivered) goes out at once
        due = entry.delivered_ms + refresh_ms
        return Deliver(entry.latest_at) if now_ms >= due else Later(due)
    delivered_since = replay_before_ms is not None and (entry.delivered_ms or 0) >= replay_before_ms
    if replay and entry.acked_at is not None and entry.acked_at >= entry.latest_at and not delivered_since:
        # (a version delivered since the pass began needs no replay: the receiver has it from this pass's time)
        return Replay(entry.latest_at)
    return None
