"""How a script opens the store the way the broker does (SPEC S7): REDIS_URL, else the embedded Redis of DATA_DIR.

When a broker already runs the embedded Redis of DATA_DIR, a script uses that server (it recorded its address
there) and leaves it running; when none does, the script starts one on DATA_DIR's files and stops it after.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import redis

from broker.errors import ConfigError
from broker.store.embedded import ADDRESS_FILE, EmbeddedRedis, pid_in

CHECK_TIMEOUT_S = 2.0


@contextlib.contextmanager
def store_url(redis_url: str | None, data_dir: str) -> Iterator[str]:
    """The URL of the store a script works on, for as long as the `with` lasts."""
    if redis_url is not None:
        yield redis_url
        return
    running = running_url(data_dir)
    if running is not None:
        yield running  # the broker's: it keeps running after the script
        return
    with EmbeddedRedis(data_dir) as url:
        yield url


def running_url(data_dir: str) -> str | None:
    """The URL of the embedded Redis a broker runs on `data_dir`, or None when no server works there.

    Raises ConfigError when a server works there but cannot be reached at a recorded address (started by a
    script, or by a broker of a version that records none): starting a second one would corrupt its files."""
    directory = Path(data_dir).resolve()
    with contextlib.suppress(OSError):
        url = f"redis://{(directory / ADDRESS_FILE).read_text().strip()}/0"
        if _serves(url, directory):
            return url
    pid = pid_in(directory)
    if pid is None:
        return None
    raise ConfigError(
        f"a redis-server (pid {pid}) works in DATA_DIR {directory} but records no address to reach it: wait for "
        "the process using it to end, or set REDIS_URL to that server"
    )


def _serves(url: str, directory: Path) -> bool:
    """Whether the server at `url` answers and keeps its files in `directory` (not some other server that got its
    port after it stopped)."""
    client = redis.Redis.from_url(url, socket_timeout=CHECK_TIMEOUT_S, socket_connect_timeout=CHECK_TIMEOUT_S)
    try:
        found = client.config_get("dir").get("dir")
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()
    return isinstance(found, str | bytes) and Path(found if isinstance(found, str) else found.decode()) == directory
