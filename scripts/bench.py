"""The project's benchmark: the broker beside a baseline measured in the same run, row by row.

    python scripts/bench.py [--quick] [--json] [--only ROW[,ROW]] [--rounds N] [--keep-logs] [--against REF]

Starts everything it needs on loopback (redis-server on a free port without persistence, the Hermes
simulator, broker replicas as `python -m broker`, each baseline in its own process, `wrk` when installed)
and stops it all on exit, Ctrl-C or SIGTERM. Prints a Markdown table: per row the broker's median with its
min-max over alternating broker/baseline rounds, the baseline's (or the target), and their ratio.
`--quick` is a smoke run of every row at tiny sizes (CI). `--against REF` runs the selected rows for this
checkout and for the commit REF (unpacked with a virtualenv of its own under ~/.cache), alternating rounds, and
prints each side's ratio to its own baseline and their quotient. Rows (`--only` names):

  create     POST /v1/runs at c8 and c64, Hermes busy        vs a bare aiohttp + one Lua script (ceiling)
  e2e        jobs/s end to end, 1 and 2 replicas; Redis commands per job      vs an arq worker
  relay      events appended per second while following 64 fast runs          vs a bare relay loop
  fanout     SSE lag p99 with 1,000 subscribers of one run                    vs direct XREAD BLOCK readers
  idle       broker RSS and Redis connections with N idle SSE clients         vs the targets
  memory     Redis memory per queued and per finished job                     vs the targets
  admission  S4.1 against a simulator capped at 10: makespan, 429s, order     vs the ideal
  fairness   S4.2 capped at 10: a late key's makespan, utilisation, 3:1 shares, trickle, many keys   vs the ideal
  conversations  S4.3 capped at 10, 1 replica: 200 sessions x 5 turns + 500 sessionless jobs, all at once:
             overlapping turns, turns out of create order, handover gap p50/p99, makespan; Redis commands
             per turn vs per sessionless job                                  vs the ideal
  upstreams  S10: three simulators capped at 4, 6, 10, one line: makespan, 429s, peaks   vs the ideal;
             50 sessions x 4 turns on their upstreams; one simulator SIGKILLed: all complete, no key twice
  cluster    create c8/c64 and end to end (1, 2 replicas) on a 3+3 Redis Cluster vs on one redis-server 7
  tracing    create c64 and end to end (1 replica) exporting traces to a local OTLP sink vs tracing off
  quotas     S4.4 capped at 20: a key's live quota under 2 replicas (peak, utilisation); a token budget's overshoot
  scrape     /readyz at 100,000 waiting keys: latency, Redis commands; largest call removing a 100,000-entry
             job's deltas (SLOWLOG)                                           vs the previous main's reads and script
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]

from benchlib import against  # noqa: E402
from benchlib.figures import Row, as_json, markdown  # noqa: E402
from benchlib.load import have_wrk  # noqa: E402
from benchlib.procs import Services, Stack  # noqa: E402
from benchlib.run import Plan  # noqa: E402
from benchlib.scenarios import (  # noqa: E402
    admission,
    cluster,
    conversations,
    create,
    e2e,
    fairness,
    fanout,
    memory,
    quotas,
    relay,
    scrape,
    tracing,
    upstreams,
)
from helpformat import HelpFormatter  # noqa: E402

Scenario = Callable[[Services, Plan], Awaitable[list[Row]]]
SCENARIOS: dict[str, Scenario] = {
    "create": create.run,
    "e2e": e2e.run,
    "relay": relay.run,
    "fanout": fanout.run,
    "idle": memory.run_idle,
    "memory": memory.run_memory,
    "admission": admission.run,
    "fairness": fairness.run,
    "conversations": conversations.run,
    "cluster": cluster.run,
    "tracing": tracing.run,
    "upstreams": upstreams.run,
    "scrape": scrape.run,
    "quotas": quotas.run,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a smoke run of every row at tiny sizes (CI)")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of the table")
    parser.add_argument("--only", default="", help=f"comma-separated rows: {','.join(SCENARIOS)} (default: every row)")
    parser.add_argument("--rounds", type=int, default=0, help="alternating rounds per row (default: 5, quick 1)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the work directory with every process log")
    parser.add_argument("--against", default="", metavar="REF", help="also measure commit REF, round by round")
    args = parser.parse_args(argv)
    unknown = {name for name in args.only.split(",") if name} - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown rows: {', '.join(sorted(unknown))}")
    return args


def compare(args: argparse.Namespace) -> int | None:
    """The side-by-side run; None when REF could not be made ready (then this checkout runs alone)."""
    options = [*(["--quick"] if args.quick else []), *(["--only", args.only] if args.only else [])]
    try:
        commit = against.prepare(against.commit_of(args.against))
    except against.AgainstError as error:
        print(f"bench: {error}; measuring this checkout alone", file=sys.stderr)
        return None
    return against.run(commit, args.rounds or (1 if args.quick else 3), options)


async def main(args: argparse.Namespace) -> int:
    plan = Plan.smoke() if args.quick else Plan.full()
    if args.rounds:
        plan = replace(plan, rounds=args.rounds)
    names = [name for name in args.only.split(",") if name] or list(SCENARIOS)
    stack = Stack()
    services = Services(stack)
    rows: list[Row] = []
    failed = False
    started = time.monotonic()
    try:
        await services.start()
        for name in names:
            began = time.monotonic()
            print(f"bench: {name} ...", file=sys.stderr, flush=True)
            try:
                rows += await SCENARIOS[name](services, plan)
            except Exception as error:  # one broken row must not hide the others' figures
                failed = True
                traceback.print_exc(file=sys.stderr)
                rows.append(Row(name, "", error=f"{type(error).__name__}: {error}"))
            print(f"bench: {name} took {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
    finally:
        await services.close()
        stack.close(keep_logs=args.keep_logs or failed)
    seconds = time.monotonic() - started
    meta = {"quick": plan.quick, "rounds": plan.rounds, "seconds": round(seconds, 1), "wrk": have_wrk(),
            "logs": str(stack.workdir) if args.keep_logs or failed else None}  # fmt: skip
    print(as_json(rows, meta) if args.json else markdown(rows))
    if not args.json:
        logs = f"; logs in {meta['logs']}" if meta["logs"] else ""
        print(f"\n{'quick' if plan.quick else 'full'} run, {seconds:.0f} s{logs}")
    return 1 if failed else 0


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through main's finally, which stops every process


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _terminate)
    try:
        arguments = parse_args()
        compared = compare(arguments) if arguments.against else None
        sys.exit(compared if compared is not None else asyncio.run(main(arguments)))
    except KeyboardInterrupt:
        sys.exit(130)
