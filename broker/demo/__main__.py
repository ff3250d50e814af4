"""`python -m broker.demo [--once] [--port P]`: starts the embedded Redis, two Hermes simulators (two upstreams,
SPEC S10), two broker replicas and a board receiver, prints the console URL, plays a handful of jobs and prints
their progress, then leaves everything up until Ctrl-C. `--once` exits after the jobs: 0 when each ended as
expected."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from aiohttp import web

from broker.demo import processes
from broker.demo.story import Story
from broker.store.embedded import EmbeddedRedis

STORY_TIMEOUT_S = 55.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m broker.demo", description=__doc__)
    parser.add_argument("--once", action="store_true", help="play the jobs, then exit (0: all ended as expected)")
    parser.add_argument("--port", type=int, default=0, help="port of the first replica and its console (default: free)")
    parser.add_argument(
        "--logs",
        type=Path,
        help="keep the processes' logs and Redis data in this folder (default: a temporary one,"
        " removed when the demo ends as expected and kept when it does not)",
    )
    args = parser.parse_args(argv)
    started = time.monotonic()

    def say(line: str) -> None:
        print(f"[{time.monotonic() - started:5.1f}s] {line}", flush=True)

    work = args.logs or Path(tempfile.mkdtemp(prefix="broker-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    code = 1
    try:
        with EmbeddedRedis(str(work / "data")) as redis_url:
            code = asyncio.run(_demo(redis_url, work, args.port or processes.free_port(), args.once, say))
            return code
    finally:
        if args.logs is None and code == 0:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"The logs are kept under {work}.", flush=True)


async def _demo(redis_url: str, work: Path, port: int, once: bool, say: processes.Say) -> int:
    ports = {"board": processes.free_port(), "replica 2": processes.free_port()}
    sims = [processes.free_port(), processes.free_port()]
    upstreams = [f"http://127.0.0.1:{sim}" for sim in sims]
    hermes = ",".join(upstreams)  # HERMES_URL: two upstreams
    board = f"http://127.0.0.1:{ports['board']}/board"
    replicas = [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{ports['replica 2']}"]
    print(f"Console: {replicas[0]}/console   (logs under {work} while it runs)", flush=True)
    receiver = web.AppRunner(processes.receiver(say), access_log=None)
    await receiver.setup()
    await web.TCPSite(receiver, "127.0.0.1", ports["board"]).start()
    children = [processes.simulator(sim, work, f"simulator-{n}") for n, sim in enumerate(sims, start=1)]
    try:
        for index, url in enumerate(replicas):
            children.append(
                processes.broker(f"replica-{index + 1}", int(url.rsplit(":", 1)[1]), redis_url, hermes, board, work)
            )
        async with aiohttp.ClientSession() as session:
            for child, url in zip(children[: len(sims)], upstreams, strict=True):
                await processes.wait_until_up(session, child, f"{url}/health")
            for child, url in zip(children[len(sims) :], replicas, strict=True):
                await processes.wait_until_up(session, child, f"{url}/healthz")
            say(f"up      redis {redis_url}, hermes simulators {', '.join(upstreams)}, replicas {', '.join(replicas)}")
            try:
                ok = await asyncio.wait_for(Story(session, replicas, upstreams, say).run(), STORY_TIMEOUT_S)
            except TimeoutError:
                say("result  the jobs did not end in time")
                ok = False
            if not once:
                say(f"ready   the console is at {replicas[0]}/console — Ctrl-C to stop")
                await _until_interrupted()
        return 0 if ok else 1
    finally:
        for child in reversed(children):
            child.stop()
        await receiver.cleanup()


async def _until_interrupted() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
