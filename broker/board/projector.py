"""What a job write persists of the board: the fold state and, when the events made one, the new version."""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen

from broker.board.report import render
from broker.config import Config
from broker.events import JobEvent
from broker.store.jobs import BoardWrite
from projections.board import BoardState, fold


@frozen(kw_only=True)
class BoardSettings:
    platform: str
    ttl_ms: int  #: HERMES_TTL
    refresh_ms: int  #: BOARD_REFRESH_INTERVAL

    @classmethod
    def from_config(cls, config: Config) -> BoardSettings | None:
        """None when board reports are disabled: nothing of the board is written."""
        if not config.board_enabled:
            return None
        return cls(
            platform=config.board_platform,
            ttl_ms=config.hermes_ttl_ms,
            refresh_ms=config.board_refresh_interval_ms,
        )


def board_write(
    before: BoardState | None, events: Sequence[JobEvent], settings: BoardSettings, now_ms: int
) -> BoardWrite:
    """Pure: fold `events` onto the board state; render the version they produced, if any."""
    state = fold(events, before)
    version = state.version
    if version is None or (before is not None and before.version == version):
        return BoardWrite(state=state)
    return BoardWrite(
        state=state,
        report=render(version, settings.platform),
        at_ms=version.at_ms,
        state_change=version.state_change,
        expire_at_ms=version.source_activity_at_ms + settings.ttl_ms,
        refresh_ms=settings.refresh_ms,
        now_ms=now_ms,
    )
