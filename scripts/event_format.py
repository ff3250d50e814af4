"""Show or switch whether the brokers store relayed Hermes events packed (SPEC S3.6, broker/codec.py).

    python scripts/event_format.py            # show: {"packed": true|false}
    python scripts/event_format.py packed     # after every replica runs a broker that reads packed events
    python scripts/event_format.py lean       # after every replica runs a broker that reads lean views
    python scripts/event_format.py full       # before rolling back to a broker that does not (packed or lean)

Lean views (broker/store/lean.py): once a finished job's deltas are removed, its view keeps its output only in
the terminal entry. The same holds for them as for packed entries: on from the start on a fresh or embedded
store, switched on with `lean` on a store an older broker wrote (an older replica leaves a lean job out of its
listing), off with `full`; views already lean stay lean.

A store no broker has used packs from the start, and so does the embedded Redis (one broker only) unless
this command pinned it `full`. A store an older broker wrote keeps full entries, which every version reads,
until this command switches packing on once the rollout is over (an older replica would hide packed events
from its SSE clients). Replicas follow a switch within 10 s; entries already stored keep their form.
Configured like the broker (REDIS_URL, REDIS_CLUSTER; with REDIS_URL unset the embedded Redis of DATA_DIR: the
running broker's, which follows the switch like any replica, else one started for the command).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import orjson
from helpformat import HelpFormatter

from broker.config import Config
from broker.errors import ConfigError
from broker.store import lean
from broker.store.connection import connect
from broker.store.entries import EventFormat, set_format, set_lean
from broker.store.opener import store_url


async def run(url: str, *, cluster: bool, switch: str | None) -> int:
    redis = connect(url, cluster=cluster)
    try:
        if switch == "lean":
            await set_lean(redis)
        elif switch is not None:
            await set_format(redis, packed=switch == "packed")
        shown = {"packed": await EventFormat(redis).packed(), "lean": await lean.allowed(redis)}
        print(orjson.dumps(shown).decode())
        return 0
    finally:
        await redis.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    choices = ["packed", "lean", "full"]
    what = "switch packing or lean views on, or both off (default: show the current form)"
    parser.add_argument("switch", nargs="?", choices=choices, help=what)
    args = parser.parse_args()
    try:
        config = Config.from_env(os.environ)
    except ConfigError as error:
        print(f"Invalid configuration: {error.message}", file=sys.stderr)
        return 2
    try:
        with store_url(config.redis_url, config.data_dir) as url:
            return asyncio.run(run(url, cluster=config.redis_cluster, switch=args.switch))
    except ConfigError as error:
        print(f"Invalid configuration: {error.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
