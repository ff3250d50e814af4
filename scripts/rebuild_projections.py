"""Rebuild job and board projections from the event streams, and show that the streams are the truth.

    python scripts/rebuild_projections.py            # dry run: print every difference, change nothing
    python scripts/rebuild_projections.py --write    # replace the stored views with the rebuilt folds

Uses REDIS_URL (and BOARD_PLATFORM) like the broker. Each job is folded from `0-0` with the same pure
functions the broker uses; a view is only replaced if no event was appended since it was read. Exit code 1
when differences were found in a dry run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import orjson

from broker.board.report import render
from broker.codec import view_codec
from broker.config import Config
from broker.store.connection import connect
from broker.store.jobs import JobStore
from broker.store.listing import IndexRepair
from projections import board as board_projection
from projections import job as job_projection


async def rebuild(redis_url: str, platform: str, write: bool) -> tuple[int, int]:
    """Returns (jobs read, jobs whose stored projections differ from the fold)."""
    redis = connect(redis_url)
    store = JobStore(redis, retention_ms=1)  # retention is never touched here
    seen = differing = 0
    try:
        async for job_id in store.job_ids():
            history = await store.read(job_id)
            stored = await store.load(job_id)
            if not history or stored is None:
                continue
            seen += 1
            events = [event for _, event in history]
            view = job_projection.fold(events)
            board = board_projection.fold(events)
            report = render(board.version, platform) if board.version else None
            stored_report = await store.stored_board_report(job_id)
            differences = _differences(stored.view, view, stored.board, board, stored_report, report)
            if not differences or view is None:
                continue
            differing += 1
            print(orjson.dumps({"job": job_id, "differences": differences}).decode())
            if write:
                at = board.version.at_ms if board.version else 0
                replaced = await store.replace_views(job_id, history[-1][0], view, board, report, at)
                print(orjson.dumps({"job": job_id, "replaced": replaced}).decode())
        differing += await rebuild_index(store, IndexRepair(redis), write)
    finally:
        await redis.aclose()
    return seen, differing


async def rebuild_index(store: JobStore, repair: IndexRepair, write: bool) -> int:
    """The listing index (SPEC S3.9) from the streams: every job under its status and latest change, no
    entry for a job that is gone. Returns how many entries differed (each printed; `--write` repairs)."""
    differing = 0
    async for job_id in store.job_ids():
        history = await store.read(job_id)
        view = job_projection.fold(event for _, event in history)
        if view is not None and await repair.job(view, history[-1][0], write=write):
            differing += 1
            print(orjson.dumps({"job": job_id, "differences": {"index": "missing or misplaced"}}).decode())
    for job_id in await repair.dangling(write=write):
        differing += 1
        print(orjson.dumps({"job": job_id, "differences": {"index": "the job is gone"}}).decode())
    return differing


def _differences(
    stored_view: object, view: object, stored_board: object, board: object, stored_report: str | None,
    report: bytes | None,
) -> dict[str, object]:  # fmt: skip
    found: dict[str, object] = {}
    if stored_view != view:
        found["view"] = {"stored": view_codec.unstructure(stored_view), "rebuilt": view_codec.unstructure(view)}
    if stored_board is not None and stored_board != board:
        found["board_state"] = {
            "stored": view_codec.unstructure(stored_board),
            "rebuilt": view_codec.unstructure(board),
        }
    if stored_report is not None and report is not None and stored_report.encode() != report:
        found["board_report"] = {"stored": stored_report, "rebuilt": report.decode()}
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true", help="replace stored views with the rebuilt folds")
    args = parser.parse_args()
    config = Config.from_env(os.environ)
    if config.redis_url is None:
        print("REDIS_URL is required (start the broker's embedded Redis and point REDIS_URL at it)", file=sys.stderr)
        return 2
    seen, differing = asyncio.run(rebuild(config.redis_url, config.board_platform, args.write))
    print(orjson.dumps({"jobs": seen, "differing": differing, "written": args.write}).decode())
    return 1 if differing and not args.write else 0


if __name__ == "__main__":
    sys.exit(main())
