"""Entry point: config -> logging -> embedded Redis if needed -> app -> serve until SIGTERM -> drain."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import web

from broker import cli, tracing
from broker import logging as broker_logging
from broker.app import create_app, drain
from broker.config import Config
from broker.config_report import log_configuration
from broker.errors import CannotListen, ConfigError, LegacyLayout
from broker.http.appkeys import inflight_key
from broker.ids import new_replica_id
from broker.logging import get_logger
from broker.store.embedded import EmbeddedRedis
from broker.tasks import cancel_all

SHUTDOWN_TAIL_S = 1.0  #: what SHUTDOWN_GRACE keeps for closing the server after in-flight requests


def main(argv: list[str] | None = None) -> int:
    cli.parse(sys.argv[1:] if argv is None else argv)  # --help, --version: exit here, nothing started
    try:
        config = Config.from_env(os.environ)
    except ConfigError as error:
        print(f"Invalid configuration: {error.message}", file=sys.stderr)
        return 2
    replica = new_replica_id()
    broker_logging.configure(config.log_level, config.log_format, replica)
    _start_tracing(config)
    log_configuration(config, os.environ, tracing=tracing.enabled())
    try:
        return _run(config, replica)
    finally:
        tracing.shutdown()  # exports what is buffered


def _start_tracing(config: Config) -> None:
    if not config.otel_traces:
        return  # nothing of OpenTelemetry is imported
    log = get_logger("broker.__main__.Tracing")
    if tracing.enable(config.otel_traces):
        log.info("Exporting traces.", extra={"exporters": ",".join(config.otel_traces)})
    else:
        log.warning("OpenTelemetry is configured, but the otel extra is not installed: no traces are exported.")


def _run(config: Config, replica: str) -> int:
    with contextlib.ExitStack() as stack:
        redis_url = config.redis_url
        if redis_url is None:
            try:
                redis_url = stack.enter_context(EmbeddedRedis(config.data_dir, announce=True))
            except ConfigError as error:
                print(f"Invalid configuration: {error.message}", file=sys.stderr)
                return 2
        try:
            with asyncio.Runner(loop_factory=_loop_factory()) as runner:
                runner.run(serve(config, redis_url, replica))
        except CannotListen as error:
            print(error.message, file=sys.stderr)
            return 1  # leaving the `with` stops the embedded Redis
        except LegacyLayout as error:
            print(error.message, file=sys.stderr)
            return 2
    return 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's event loop when it is installed (it is a dependency on Linux), else asyncio's own."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


async def serve(config: Config, redis_url: str, replica: str | None = None) -> None:
    """Serve until SIGTERM/SIGINT, then drain: not ready, jobs handed back, streams ended, requests finished."""
    log = get_logger("broker.__main__.Server")
    app = create_app(config, redis_url=redis_url, replica=replica)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TAIL_S)  # requests were waited for
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    try:
        await site.start()
    except OSError as error:
        await runner.cleanup()  # the app started (Redis, driver): hand everything back before exiting
        raise CannotListen(config.host, config.port, error) from None
    log.info("Listening.", extra={"host": config.host, "port": config.port})
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping.set)
    await stopping.wait()
    started = time.monotonic()
    log.info("Draining on shutdown.", extra={"graceMs": config.shutdown_grace_ms})
    budget_s = config.shutdown_grace_ms / 1000 - SHUTDOWN_TAIL_S
    # /readyz answers 503 from here until the process exits. A Redis that does not answer (frozen, its sockets open)
    # holds a drain's writes for good: the drain is cut at the grace, and its jobs are taken over within RUNS_LEASE
    if not await _within(drain(app), budget_s):
        log.warning("The drain did not finish within SHUTDOWN_GRACE: Redis does not answer.")
    finished = await app[inflight_key].idle(budget_s - (time.monotonic() - started))
    log.info("Finished in-flight requests.", extra={"finished": finished, "left": app[inflight_key].count})
    if not await _within(runner.cleanup(), max(budget_s - (time.monotonic() - started), 0) + SHUTDOWN_TAIL_S):
        log.warning("Closing did not finish within SHUTDOWN_GRACE: Redis does not answer.")
    # what is left (watches of forsaken runs, deliveries on their way) is cancelled until it stops: the event loop's
    # own last cancel is a single one, which a call inside redis-py can drop, and the process would not exit
    left = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
    if not await _within(cancel_all(left), SHUTDOWN_TAIL_S):
        log.warning("Some tasks did not stop on shutdown.", extra={"tasks": sorted(task.get_name() for task in left)})
    log.info("Stopped.", extra={"durationMs": round((time.monotonic() - started) * 1000)})


async def _within(step: Coroutine[Any, Any, None], budget_s: float) -> bool:
    """Run a step of the shutdown, cut (cancelled) after `budget_s`; False: it was cut."""
    try:
        async with asyncio.timeout(max(budget_s, 0)):
            await step
    except TimeoutError:
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
