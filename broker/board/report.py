"""The board report of SPEC S5 as bytes. Pure: the same version always renders the same bytes."""

from __future__ import annotations

import orjson

from projections.board import BoardVersion, EntryState


def render(version: BoardVersion, platform: str) -> bytes:
    """The JSON body POSTed to BOARD_URL, keys in the contract's order.

    `sessionId`, `link` and `links` are omitted when the job has none; `error` and `runId`
    are always present (null when none); `reporting` is always present, even when both are false.
    """
    report: dict[str, object] = {"key": version.key, "platform": platform}
    if version.session_id is not None:
        report["sessionId"] = version.session_id
    report["state"] = version.state.value
    report["title"] = version.title
    if version.link is not None:
        report["link"] = version.link
    if version.links is not None:
        report["links"] = [{"text": link.text, "url": link.url} for link in version.links]
    report["error"] = version.error
    report["runId"] = version.run_id
    report["at"] = version.at_ms
    report["sourceActivityAt"] = version.source_activity_at_ms
    report["reporting"] = {"board": version.reporting.board, "post": version.reporting.post}
    return orjson.dumps(report)


def is_active(version: BoardVersion) -> bool:
    """Whether the entry still shows WORKING: reconciliation repairs only active entries (S5.6)."""
    return version.state is EntryState.RUNNING
