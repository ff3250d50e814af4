"""Composition root: config -> logging -> embedded Redis if needed -> app -> run."""

from __future__ import annotations

import contextlib
import os
import sys

from aiohttp import web

from broker import logging as broker_logging
from broker.config import Config
from broker.errors import ConfigError
from broker.http.app import create_app
from broker.store.embedded import EmbeddedRedis


def main() -> int:
    try:
        config = Config.from_env(os.environ)
    except ConfigError as error:
        print(f"Invalid configuration: {error.message}", file=sys.stderr)
        return 2
    broker_logging.configure(config.log_level, config.log_format)
    with contextlib.ExitStack() as stack:
        redis_url = config.redis_url
        if redis_url is None:
            try:
                redis_url = stack.enter_context(EmbeddedRedis(config.data_dir))
            except ConfigError as error:
                print(f"Invalid configuration: {error.message}", file=sys.stderr)
                return 2
        app = create_app(config, redis_url=redis_url)
        web.run_app(
            app,
            host=config.host,
            port=config.port,
            print=None,
            access_log=None,
            shutdown_timeout=config.shutdown_grace_ms / 1000,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
