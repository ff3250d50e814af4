"""Rebuild job and board projections from the event streams, and show that the streams are the truth.

    python scripts/rebuild_projections.py            # dry run: print every difference, change nothing
    python scripts/rebuild_projections.py --write    # replace what differs with the rebuilt folds
    python scripts/rebuild_projections.py --job J    # one job only

Configured like the broker: REDIS_URL (unset: the embedded Redis of DATA_DIR, the running broker's if one runs
there, else started for the run and stopped after), and BOARD_ENABLED / BOARD_PLATFORM / HERMES_TTL /
BOARD_REFRESH_INTERVAL for the board reports. Every job stream is folded from `0-0` with the same pure
functions the broker uses; a missing, undecodable or different view, board state or latest board report
is a difference (one JSON line per job on stdout, with the job id), and so is each fairness key's hourly
usage bucket that is not what the streams add up to (one line per hour and key, SPEC S4.5). --write
recreates a job's projections as a job write would have, only if no event was appended since the stream
was read, and an hour's usage only if no replica counted a run there since, so it is safe beside live replicas.
Progress goes to stderr; the last stdout line is the summary. Exit code 1 when differences were found in a
dry run, or when --write could not replace one of them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import AsyncIterator

import orjson
from helpformat import HelpFormatter
from redis.asyncio import Redis

from broker.clock import SystemClock
from broker.config import Config
from broker.errors import ConfigError
from broker.rebuild import Outcome, Rebuild, RebuildSettings, Totals
from broker.store.connection import connect
from broker.store.jobs import JobStore
from broker.store.listing import IndexRepair
from broker.store.opener import store_url
from broker.store.rebuild import RebuildStore
from broker.store.usage import UsageStore
from broker.usage_rebuild import rebuild_usage
from projections import job as job_projection


async def rebuild(config: Config, redis_url: str, *, write: bool, job: str | None, every: int) -> Totals:
    redis = connect(redis_url, cluster=config.redis_cluster)
    started = time.monotonic()

    def outcome(found: Outcome) -> None:
        line: dict[str, object] = {"job": found.finding.job_id, "differences": found.finding.differences}
        if found.replaced is not None:
            line["replaced"] = found.replaced
        print(orjson.dumps(line).decode(), flush=True)

    def progress(totals: Totals) -> None:
        _note(totals, "", started)

    async def one(job_id: str) -> AsyncIterator[str]:
        yield job_id

    try:
        runner = Rebuild(RebuildStore(redis), RebuildSettings.from_config(config), SystemClock(), write=write)
        job_ids = one(job) if job is not None else JobStore(redis, retention_ms=1).job_ids()
        totals = await runner.run(job_ids, outcome, progress, progress_every=every)
        await rebuild_index(JobStore(redis, retention_ms=1), IndexRepair(redis), totals, write=write, job=job)
        if job is None:
            await rebuild_usage_buckets(config, JobStore(redis, retention_ms=1), redis, totals, write=write)
    finally:
        await redis.aclose()
    _note(totals, "done, ", started)
    return totals


async def rebuild_index(store: JobStore, repair: IndexRepair, totals: Totals, *, write: bool, job: str | None) -> None:
    """The GET /v1/runs index (SPEC S3.9) from the streams: every job under its status and latest change, no
    entry for a job that is gone. Each wrong entry is a difference (one line; `--write` repairs it)."""
    job_ids = [job] if job is not None else [job_id async for job_id in store.job_ids()]
    for job_id in job_ids:
        history = await store.read(job_id)
        view = job_projection.fold(event for _, event in history)
        if view is not None and await repair.job(view, history[-1][0], write=write):
            _index_difference(totals, job_id, "missing or misplaced", write)
    for job_id in await repair.dangling(write=write) if job is None else []:
        _index_difference(totals, job_id, "the job is gone", write)


async def rebuild_usage_buckets(config: Config, store: JobStore, redis: Redis, totals: Totals, *, write: bool) -> None:
    """Each fairness key's hourly usage (SPEC S4.5) from the streams: each bucket that differs is one line (the
    hour, the key, the stored and the rebuilt counters); `--write` replaces its hour."""
    usage = UsageStore(redis, retention_ms=config.runs_retention_ms)
    now_ms = int(time.time() * 1000)
    outcome = await rebuild_usage(
        store, usage, store.job_ids(), now_ms=now_ms, retention_ms=config.runs_retention_ms, write=write
    )
    for difference in outcome.differences:
        totals.differing += 1
        line = difference.line()
        if write:
            line["replaced"] = difference.hour in outcome.replaced
            totals.replaced += difference.hour in outcome.replaced
        print(orjson.dumps(line).decode(), flush=True)


def _index_difference(totals: Totals, job_id: str, problem: str, write: bool) -> None:
    totals.differing += 1
    line: dict[str, object] = {"job": job_id, "differences": {"index": problem}}
    if write:
        totals.replaced += 1
        line["replaced"] = True
    print(orjson.dumps(line).decode(), flush=True)


def _note(totals: Totals, what: str, started: float) -> None:
    counts = f"{totals.jobs} jobs read, {totals.differing} differing, {totals.replaced} replaced"
    print(
        f"rebuild: {what}{counts}, {time.monotonic() - started:.1f} s",
        file=sys.stderr,
        flush=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--write", action="store_true", help="replace what differs with the rebuilt folds")
    parser.add_argument("--job", metavar="J", help="rebuild this job only (default: every job)")
    parser.add_argument("--progress-every", type=int, default=1000, metavar="N", help="a stderr line every N jobs")
    args = parser.parse_args()
    try:
        config = Config.from_env(os.environ)
    except ConfigError as error:
        print(f"Invalid configuration: {error.message}", file=sys.stderr)
        return 2
    try:
        with store_url(config.redis_url, config.data_dir) as url:
            totals = asyncio.run(
                rebuild(config, url, write=args.write, job=args.job, every=max(1, args.progress_every))
            )
    except ConfigError as error:
        print(f"Invalid configuration: {error.message}", file=sys.stderr)
        return 2
    summary = {"jobs": totals.jobs, "differing": totals.differing, "written": args.write, "replaced": totals.replaced}
    print(orjson.dumps(summary).decode())
    if args.job is not None and totals.jobs == 0:
        print(f"Job {args.job} has no event stream.", file=sys.stderr)
        return 2
    unrepaired = totals.differing - totals.replaced if args.write else totals.differing
    return 1 if unrepaired else 0


if __name__ == "__main__":
    sys.exit(main())
