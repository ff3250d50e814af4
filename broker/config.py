"""Every variable of SPEC S2, parsed once into a frozen object. No other module reads the environment."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs
from attrs import frozen

from broker.errors import ConfigError

LOG_LEVELS = ("debug", "info", "warn", "error")
LOG_FORMATS = ("json", "text")
FAIRNESS_DEFAULTS = ("session_key", "session_id", "none")  #: ADMISSION_FAIRNESS_DEFAULT (SPEC S4.2)
MAX_FAIRNESS_WEIGHT = 1_000.0


@frozen(kw_only=True)
class Config:
    """The broker's configuration; durations are milliseconds (`*_ms`)."""

    host: str = "0.0.0.0"
    port: int = 8080
    redis_url: str | None = None
    redis_cluster: bool = False  #: REDIS_URL names one node of a Redis Cluster (SPEC S9)
    redis_wait_replicas: int = 0  #: acknowledge writes only once this many replicas have them (WAIT)
    redis_wait_timeout_ms: int = 1_000
    data_dir: str = "./data"
    hermes_url: str = "http://127.0.0.1:8642"
    hermes_api_key: str | None = attrs.field(default=None, repr=False)  # a secret: never printed
    hermes_timeout_ms: int = 30_000
    hermes_max_concurrent: int = 0  #: 0 = learn the limit from Hermes's answers (SPEC S4.1)
    admission_fairness_default: str = "session_key"  #: a job's key when it names none (SPEC S4.2)
    admission_fairness_weights: tuple[tuple[str, float], ...] = ()  #: weights per key, winning over a create's
    runs_concurrency: int = 64
    runs_hold_ms: int = 2_400_000
    runs_resubmit: int = 3
    runs_backoff_ms: int = 1_000
    runs_backoff_max_ms: int = 30_000
    runs_poll_interval_ms: int = 2_000
    runs_lease_ms: int = 15_000
    runs_event_block_ms: int = 15_000
    runs_retention_ms: int = 604_800_000
    runs_events_maxlen: int = 100_000
    runs_proxy_enabled: bool = False
    runs_approval_allow_always: bool = False
    shutdown_grace_ms: int = 25_000
    board_enabled: bool = False
    board_url: str | None = None
    board_platform: str = "runs"
    board_retries: int = 5
    board_timeout_ms: int = 10_000
    board_refresh_interval_ms: int = 60_000
    board_reconcile_interval_ms: int = 3_600_000
    hermes_ttl_ms: int = 86_400_000
    log_level: str = "info"
    log_format: str = "json"
    console_enabled: bool = True

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Config:
        """Parse the environment; raise ConfigError naming the first bad variable."""
        values: dict[str, Any] = {}
        for name, (field, parse) in _VARIABLES.items():
            raw = env.get(name)
            if raw is None:
                continue  # defaults live only on the class (STYLE A.8 #3)
            try:
                values[field] = parse(raw)
            except ValueError as exc:
                raise ConfigError(f"{name}={raw!r} {exc}") from None
        config = cls(**values)
        if config.board_enabled and not config.board_url:
            raise ConfigError("BOARD_URL is required when BOARD_ENABLED=true")
        if config.redis_cluster and not config.redis_url:
            raise ConfigError("REDIS_URL is required when REDIS_CLUSTER=true (the embedded Redis is no cluster)")
        return config

    def with_(self, **changes: Any) -> Config:
        return attrs.evolve(self, **changes)


def _integer(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError("is not an integer") from None
        if value < minimum:
            raise ValueError(f"must be at least {minimum}")
        if maximum is not None and value > maximum:
            raise ValueError(f"must be at most {maximum}")
        return value

    return parse


def _boolean(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError("is not a boolean (true/false)")


def _url(raw: str) -> str:
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("is not an http(s) URL")
    return raw.strip().rstrip("/")


def _redis_url(raw: str) -> str | None:
    if not raw.strip():
        return None  # an empty REDIS_URL means "embedded", as unset does
    parts = urlsplit(raw.strip())
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError("is not a redis://, rediss:// or unix:// URL")
    return raw.strip()


def _choice(options: tuple[str, ...]) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        if value == "warning":
            value = "warn"
        if value not in options:
            raise ValueError(f"is not one of {', '.join(options)}")
        return value

    return parse


def _weights(raw: str) -> tuple[tuple[str, float], ...]:
    """`key=weight,key=weight` (a key may hold `=`: the last one separates the weight); 0 < weight <= 1000."""
    pairs: dict[str, float] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        key, sep, number = item.strip().rpartition("=")
        if not sep or not key:
            raise ValueError(f"has {item.strip()!r}, not key=weight")
        try:
            weight = float(number)
        except ValueError:
            raise ValueError(f"has a weight that is not a number: {number!r}") from None
        if not 0 < weight <= MAX_FAIRNESS_WEIGHT:
            raise ValueError(f"has a weight out of range (0, 1000]: {number!r}")
        pairs[key] = weight
    return tuple(pairs.items())


def _text(raw: str) -> str:
    return raw


def _optional_text(raw: str) -> str | None:
    return raw or None


def _optional_url(raw: str) -> str | None:
    return _url(raw) if raw.strip() else None


_VARIABLES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "HOST": ("host", _text),
    "PORT": ("port", _integer(0, 65535)),
    "REDIS_URL": ("redis_url", _redis_url),
    "REDIS_CLUSTER": ("redis_cluster", _boolean),
    "REDIS_WAIT_REPLICAS": ("redis_wait_replicas", _integer(0)),
    "REDIS_WAIT_TIMEOUT": ("redis_wait_timeout_ms", _integer(1)),
    "DATA_DIR": ("data_dir", _text),
    "HERMES_URL": ("hermes_url", _url),
    "HERMES_API_KEY": ("hermes_api_key", _optional_text),
    "HERMES_TIMEOUT": ("hermes_timeout_ms", _integer(1)),
    "HERMES_MAX_CONCURRENT": ("hermes_max_concurrent", _integer(0)),
    "ADMISSION_FAIRNESS_DEFAULT": ("admission_fairness_default", _choice(FAIRNESS_DEFAULTS)),
    "ADMISSION_FAIRNESS_WEIGHTS": ("admission_fairness_weights", _weights),
    "RUNS_CONCURRENCY": ("runs_concurrency", _integer(1)),
    "RUNS_HOLD": ("runs_hold_ms", _integer(0)),
    "RUNS_RESUBMIT": ("runs_resubmit", _integer(0)),
    "RUNS_BACKOFF": ("runs_backoff_ms", _integer(1)),
    "RUNS_BACKOFF_MAX": ("runs_backoff_max_ms", _integer(1)),
    "RUNS_POLL_INTERVAL": ("runs_poll_interval_ms", _integer(1)),
    "RUNS_LEASE": ("runs_lease_ms", _integer(300)),
    "RUNS_EVENT_BLOCK": ("runs_event_block_ms", _integer(1)),
    "RUNS_RETENTION": ("runs_retention_ms", _integer(1)),
    "RUNS_EVENTS_MAXLEN": ("runs_events_maxlen", _integer(1)),
    "RUNS_PROXY_ENABLED": ("runs_proxy_enabled", _boolean),
    "RUNS_APPROVAL_ALLOW_ALWAYS": ("runs_approval_allow_always", _boolean),
    "SHUTDOWN_GRACE": ("shutdown_grace_ms", _integer(0)),
    "BOARD_ENABLED": ("board_enabled", _boolean),
    "BOARD_URL": ("board_url", _optional_url),
    "BOARD_PLATFORM": ("board_platform", _text),
    "BOARD_RETRIES": ("board_retries", _integer(1)),
    "BOARD_TIMEOUT": ("board_timeout_ms", _integer(1)),
    "BOARD_REFRESH_INTERVAL": ("board_refresh_interval_ms", _integer(0)),
    "BOARD_RECONCILE_INTERVAL": ("board_reconcile_interval_ms", _integer(1)),
    "HERMES_TTL": ("hermes_ttl_ms", _integer(1)),
    "LOG_LEVEL": ("log_level", _choice(LOG_LEVELS)),
    "LOG_FORMAT": ("log_format", _choice(LOG_FORMATS)),
    "CONSOLE_ENABLED": ("console_enabled", _boolean),
}
