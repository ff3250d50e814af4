"""Move a store of the key layout before partitions (layout 1) into the partitioned layout (SPEC S9).

    python scripts/migrate_layout.py          # stop every broker first; REDIS_URL names the Redis
    python scripts/migrate_layout.py --check  # only say whether the store needs it (exit 1 if it does)

A broker started on a layout-1 store refuses to start and names this command. The migration works on a
single Redis (layout 1 never ran on a cluster): each job's keys are renamed into their partition (they
keep their expiry), the due schedule, the admission line and the board's due set and index are moved
with their scores, board outbox entries are re-added to their partition's outbox, and the work stream
(wake-up hints) is dropped. It can be run again after an interruption. Configured like the broker: with
REDIS_URL unset it opens the embedded Redis of DATA_DIR (a broker refuses to start on layout 1, so none runs
there; it starts the server and stops it after).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

import orjson
from attrs import asdict
from helpformat import HelpFormatter

from broker.config import Config
from broker.errors import ConfigError
from broker.store.connection import connect
from broker.store.migrate import legacy_keys, migrate
from broker.store.opener import store_url


async def run(url: str, *, check: bool) -> int:
    redis = connect(url)
    try:
        found = await legacy_keys(redis)
        if check or not found:
            print(orjson.dumps({"legacy": bool(found), "found": found}).decode())
            return 1 if found and check else 0
        moved = await migrate(redis)
        left = await legacy_keys(redis)
        print(orjson.dumps({"migrated": asdict(moved), "left": left}).decode())
        return 1 if left else 0
    finally:
        await redis.aclose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--check", action="store_true", help="only report whether the store needs migrating")
    args = parser.parse_args()
    try:
        config = Config.from_env(os.environ)
    except ConfigError as error:
        print(f"Invalid configuration: {error.message}", file=sys.stderr)
        return 2
    if config.redis_cluster:
        print("REDIS_CLUSTER=true: a cluster never held the layout before partitions; nothing to do", file=sys.stderr)
        return 0
    try:
        with store_url(config.redis_url, config.data_dir) as url:
            return asyncio.run(run(url, check=args.check))
    except ConfigError as error:
        print(f"Invalid configuration: {error.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
