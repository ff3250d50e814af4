"""The projection rebuild of SPEC S7: fold each job stream from 0-0, compare with what is stored, replace.

`compare` is pure. A job's board state is expected when BOARD_ENABLED is set (as for the broker) or when
the job shows it had one (a `board` field in its view, or a board hash); a board report only while the
version has not expired (`sourceActivityAt + HERMES_TTL`, or the stored `expire_at`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, Callable, Sequence
from typing import TypeVar

from attrs import define, evolve, frozen

from broker.board.projector import BoardSettings, board_write
from broker.clock import Clock
from broker.codec import decode_board, decode_view, encode_board, encode_view, view_codec
from broker.config import Config
from broker.events import RunAccepted
from broker.store import keys
from broker.store.jobs import BoardWrite
from broker.store.rebuild import RebuildStore, Replacement, StoredJob
from projections import job as job_projection
from projections.board import BoardState
from projections.job import JobView

CONCURRENCY = 16  #: jobs read and compared at once
SHOWN_CHARS = 500  #: of an undecodable stored value, in a finding

_T = TypeVar("_T", JobView, BoardState)


@frozen(kw_only=True)
class RebuildSettings:
    board: BoardSettings  #: platform, HERMES_TTL and refresh interval of the board reports
    board_enabled: bool  #: BOARD_ENABLED: every job is expected to have board state

    @classmethod
    def from_config(cls, config: Config) -> RebuildSettings:
        board = BoardSettings(
            platform=config.board_platform,
            ttl_ms=config.hermes_ttl_ms,
            refresh_ms=config.board_refresh_interval_ms,
        )
        return cls(board=board, board_enabled=config.board_enabled)


@frozen
class Finding:
    """A job whose stored projections differ from the fold of its stream."""

    job_id: str
    differences: dict[str, object]
    replacement: Replacement | None  #: None: the stream folds to nothing, there is nothing to write


def compare(stored: StoredJob, settings: RebuildSettings, now_ms: int) -> Finding | None:
    """Pure: what differs between the stored projections and the fold of the stream; None when nothing."""
    events = [event for _, event in stored.history]
    view = job_projection.fold(events)
    removed = stored.view.get("deltas_removed", "")
    if view is not None and removed.isdigit():  # the job's deltas were removed after it ended (SPEC S3.6)
        view = evolve(view, event_count=view.event_count + int(removed))
    if view is None or stored.last_id is None:
        return Finding(stored.job_id, {"stream": "holds no JobCreated: nothing to rebuild"}, None)
    found: dict[str, object] = {}
    _put(found, "view", _difference(stored.view.get("state"), view, decode_view))
    if stored.view.get("last_id") != stored.last_id:
        found["last_id"] = {"stored": stored.view.get("last_id"), "rebuilt": stored.last_id}
    board_state: bytes | None = None
    board: BoardWrite | None = None
    if settings.board_enabled or "board" in stored.view or stored.board:
        write = _retained(board_write(None, events, settings.board, now_ms), stored.board)
        board_state = encode_board(write.state)
        _put(found, "board_state", _difference(stored.view.get("board"), write.state, decode_board))
        if write.report is not None and write.expire_at_ms > now_ms and _report_differs(found, stored.board, write):
            board = write
    if not found:
        return None
    replacement = Replacement(
        last_id=stored.last_id,
        seen_view_last_id=stored.view.get("last_id", ""),
        view=encode_view(view),
        board_state=board_state,
        board=board,
        runs=tuple(
            (keys.run_field(event.attempt), event.hermes_run_id) for event in events if isinstance(event, RunAccepted)
        ),
    )
    return Finding(stored.job_id, found, replacement)


def _put(found: dict[str, object], name: str, difference: dict[str, object] | None) -> None:
    if difference is not None:
        found[name] = difference


def _difference(raw: str | None, rebuilt: _T, decoder: Callable[[str], _T | None]) -> dict[str, object] | None:
    expected = view_codec.unstructure(rebuilt)
    if raw is None:
        return {"problem": "missing", "stored": None, "rebuilt": expected}
    decoded = decoder(raw)
    if decoded is None:
        return {"problem": "undecodable", "stored": raw[:SHOWN_CHARS], "rebuilt": expected}
    if decoded != rebuilt:
        return {"problem": "different", "stored": view_codec.unstructure(decoded), "rebuilt": expected}
    return None


def _retained(write: BoardWrite, board: dict[str, str]) -> BoardWrite:
    """The version keeps the expiry its job write gave it (HERMES_TTL may differ here)."""
    stored = board.get("expire_at", "")
    return evolve(write, expire_at_ms=int(stored)) if stored.isdigit() else write


def _report_differs(found: dict[str, object], board: dict[str, str], write: BoardWrite) -> bool:
    assert write.report is not None
    report = write.report.decode()
    if board.get("latest") == report and board.get("latest_at") == str(write.at_ms):
        return False
    problem = "missing" if "latest" not in board else "different"
    found["board_report"] = {
        "problem": problem,
        "stored": board.get("latest"),
        "stored_at": board.get("latest_at"),
        "rebuilt": report,
        "rebuilt_at": write.at_ms,
    }
    return True


@frozen
class Outcome:
    finding: Finding
    replaced: bool | None  #: None: not written (a dry run, or nothing to write)


@define
class Totals:
    jobs: int = 0
    differing: int = 0
    replaced: int = 0


class Rebuild:
    """Compares (and with `write`, replaces) the projections of the jobs it is given."""

    def __init__(self, store: RebuildStore, settings: RebuildSettings, clock: Clock, *, write: bool) -> None:
        self._store = store
        self._settings = settings
        self._clock = clock
        self._write = write

    async def job(self, job_id: str) -> tuple[bool, Outcome | None]:
        """(whether the job has a stream, what differs); a job whose projections are its fold gives None."""
        stored = await self._store.read(job_id)
        if not stored.history:
            return False, None  # gone (expired or deleted) since it was listed, or never there
        finding = compare(stored, self._settings, self._clock.now_ms())
        if finding is None:
            return True, None
        replaced = None
        if self._write and finding.replacement is not None:
            replaced = await self._store.replace(job_id, finding.replacement)
        return True, Outcome(finding, replaced)

    async def run(
        self,
        job_ids: AsyncIterable[str],
        on_outcome: Callable[[Outcome], None],
        on_progress: Callable[[Totals], None],
        *,
        progress_every: int = 1000,
    ) -> Totals:
        """Every job once (SCAN may list one twice), CONCURRENCY at a time; progress every `progress_every`."""
        totals = Totals()
        seen: set[str] = set()
        batch: list[str] = []
        async for job_id in job_ids:
            if job_id in seen:
                continue
            seen.add(job_id)
            batch.append(job_id)
            if len(batch) == CONCURRENCY:
                await self._batch(batch, totals, on_outcome, on_progress, progress_every)
                batch = []
        await self._batch(batch, totals, on_outcome, on_progress, progress_every)
        return totals

    async def _batch(
        self,
        batch: Sequence[str],
        totals: Totals,
        on_outcome: Callable[[Outcome], None],
        on_progress: Callable[[Totals], None],
        every: int,
    ) -> None:
        outcomes = await asyncio.gather(*(self.job(job_id) for job_id in batch))
        for exists, outcome in outcomes:
            if not exists:
                continue
            totals.jobs += 1
            if outcome is not None:
                totals.differing += 1
                totals.replaced += outcome.replaced is True
                on_outcome(outcome)
            if totals.jobs % every == 0:
                on_progress(totals)
