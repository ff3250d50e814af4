"""`python -m broker.simulator`: run the Hermes simulator on a port until interrupted."""

from __future__ import annotations

import argparse
import logging

from aiohttp import web

from broker.simulator.app import create_app
from broker.simulator.state import Settings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m broker.simulator",
        description="Simulated Hermes 0.19.0 /v1/runs",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,  # every option's default after its help
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8642, help="port to listen on")
    parser.add_argument("--api-key", default=None, help="require this bearer key on /v1 routes (None: no key)")
    parser.add_argument("--max-concurrent", type=int, default=10, help="live runs before 429 (0 = no cap)")
    parser.add_argument("--keepalive", type=float, default=30.0, help="seconds between `: keepalive` comments")
    parser.add_argument("--approval-timeout", type=float, default=60.0, help="seconds before a prompt counts as deny")
    parser.add_argument("--upstream-main", action="store_true", help="honour Idempotency-Key, report `interrupted`")
    args = parser.parse_args(argv)
    settings = Settings(
        api_key=args.api_key,
        max_concurrent=args.max_concurrent,
        keepalive_s=args.keepalive,
        approval_timeout_s=args.approval_timeout,
        upstream_main=args.upstream_main,
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # a stream whose subscriber was dropped (a fault) may still wait: SIGTERM ends the simulator within 2 s anyway
    web.run_app(
        create_app(settings), host=args.host, port=args.port, print=print, access_log=None, shutdown_timeout=2.0
    )


if __name__ == "__main__":
    main()
