"""Every variable of SPEC S2, parsed once into a frozen object. No other module reads the environment."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs
from attrs import frozen

from broker.admission.quotas import NO_QUOTAS, Quotas, parse_quotas
from broker.callbacks.hosts import parse_hosts
from broker.config_values import (
    boolean,
    boolean_or_false,
    choice,
    integer,
    integers,
    optional_text,
    optional_url,
    redis_url,
    share,
    signing_secrets,
    text,
    urls,
    weights,
    without_credentials,
)
from broker.errors import ConfigError
from broker.upstreams import Upstream, build, parse_urls

LOG_LEVELS = ("debug", "info", "warn", "error")
LOG_FORMATS = ("json", "text")
#: variables whose value never appears in an error message
_HIDDEN = frozenset({"HERMES_API_KEY", "BOARD_SIGNING_SECRET", "CALLBACK_SIGNING_SECRET"})
#: Prefixes of the broker's own variables: one it does not know is named in a warn line at startup (a typo).
PREFIXES = ("HERMES_", "RUNS_", "BOARD_", "REDIS_", "ADMISSION_", "CALLBACK_")
FAIRNESS_DEFAULTS = ("session_key", "session_id", "none")  #: ADMISSION_FAIRNESS_DEFAULT (SPEC S4.2)
#: ADMISSION_FAIRNESS_COST (SPEC S4.2 "What a turn costs"): what a key is charged per job; cost.CostMode's values
FAIRNESS_COSTS = ("time", "tokens", "runs")
MULTITASK = ("enqueue", "reject", "interrupt", "parallel")  #: RUNS_SESSION_MULTITASK, `scheduling.multitask` (S4.3)


def _limits(value: int | tuple[int, ...]) -> tuple[int, ...]:
    """`HERMES_MAX_CONCURRENT` as a tuple: one number stands for every upstream."""
    return (value,) if isinstance(value, int) else tuple(value)


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
    #: one or more Hermes base URLs, comma-separated, each an upstream (SPEC S10); see `upstreams`
    hermes_url: str = attrs.field(default="http://127.0.0.1:8642", repr=lambda raw: repr(without_credentials(raw)))
    #: one key for all upstreams or a comma-separated list of one per upstream (an empty item: no key)
    hermes_api_key: str | None = attrs.field(default=None, repr=False)  # a secret: never printed
    hermes_timeout_ms: int = 30_000
    #: one value for all upstreams or one per upstream; 0 = learn the limit from Hermes's answers (SPEC S4.1)
    hermes_max_concurrent: tuple[int, ...] = attrs.field(default=(0,), converter=_limits)
    hermes_affinity_grace_ms: int = 30_000  #: a session waits this long for its upstream while it is down (S10)
    hermes_upstream_lost_ms: int = 300_000  #: an upstream silent this long is lost: its runs move (SPEC S10)
    #: largest execution body (the JSON the broker sends to Hermes), in bytes; a larger create answers 413 (SPEC S7)
    hermes_max_body: int = 1_048_576
    admission_fairness_default: str = "session_key"  #: a job's key when it names none (SPEC S4.2)
    admission_fairness_weights: tuple[tuple[str, float], ...] = ()  #: weights per key, winning over a create's
    #: what a key is charged per job (SPEC S4.2 "What a turn costs"): time (slot ms), tokens, or runs (fixed tags at
    #: create: broker/admission/fair.py; the others broker/admission/cost.py)
    admission_fairness_cost: str = "time"
    #: the estimate of a key without history, in the mode's unit: ms of slot time (`time`) or tokens (`tokens`)
    admission_fairness_guess: int = 60_000
    admission_quotas: Quotas = NO_QUOTAS  #: ADMISSION_QUOTAS: limits per fairness key (SPEC S4.4)
    admission_max_waiting: int = 0  #: most waiting jobs in all; 0: no bound (SPEC S4.4)
    #: share of Redis's maxmemory past which creates answer 503, so accepted jobs keep room to finish (SPEC S4.4)
    redis_memory_high: float = 0.9
    runs_session_multitask: str = "enqueue"  #: what a new turn of a busy session does (SPEC S4.3)
    runs_session_history: bool = False  #: send a session's earlier completed turns to Hermes (SPEC S4.3)
    runs_session_history_turns: int = 50  #: ... at most this many of the latest
    runs_concurrency: int = 64
    runs_hold_ms: int = 2_400_000
    runs_resubmit: int = 3
    runs_backoff_ms: int = 1_000
    runs_backoff_max_ms: int = 30_000
    runs_poll_interval_ms: int = 2_000
    runs_lease_ms: int = 15_000
    runs_event_block_ms: int = 15_000
    runs_retention_ms: int = 604_800_000
    runs_delta_retention_ms: int = 3_600_000  #: 0: a finished job keeps its deltas as long as the rest
    runs_events_maxlen: int = 100_000
    runs_proxy_enabled: bool = False
    runs_approval_allow_always: bool = False
    shutdown_grace_ms: int = 25_000
    board_enabled: bool = False
    board_url: str | None = None
    board_platform: str = "runs"
    #: BOARD_SIGNING_SECRET: the decoded keys deliveries are signed with (SPEC S5.7); empty = unsigned
    board_signing_secrets: tuple[bytes, ...] = attrs.field(default=(), repr=False)  # secrets: never printed
    board_retries: int = 5
    board_timeout_ms: int = 10_000
    board_refresh_interval_ms: int = 60_000
    board_reconcile_interval_ms: int = 3_600_000
    hermes_ttl_ms: int = 86_400_000
    callback_allowed_hosts: tuple[str, ...] = ()  #: hosts a job callback may name (SPEC S5.8); empty: refused
    callback_signing_secrets: tuple[bytes, ...] = attrs.field(default=(), repr=False)  # secrets: never printed
    callback_retry_window_ms: int = 86_400_000  #: how long one callback delivery is retried
    log_level: str = "info"
    log_format: str = "json"
    console_enabled: bool = True
    #: Trace exporters OpenTelemetry's own variables ask for (SPEC S6.1): `otlp`, `console`; empty: no traces.
    otel_traces: tuple[str, ...] = ()

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
                shown = "<hidden>" if name in _HIDDEN else repr(without_credentials(raw))
                raise ConfigError(f"{name}={shown} {exc}") from None
        values["otel_traces"] = _otel_traces(env)
        config = cls(**values)
        if config.board_enabled and not config.board_url:
            raise ConfigError("BOARD_URL is required when BOARD_ENABLED=true")
        config.upstreams  # noqa: B018 -- the lists' lengths: a ConfigError naming the variable
        if config.redis_cluster and not config.redis_url:
            raise ConfigError("REDIS_URL is required when REDIS_CLUSTER=true (the embedded Redis is no cluster)")
        return config

    @property
    def upstreams(self) -> tuple[Upstream, ...]:
        """The Hermes deployments, in `HERMES_URL` order (SPEC S10); raises ConfigError for a list of a wrong length."""
        return build(parse_urls(self.hermes_url), self.hermes_api_key, self.hermes_max_concurrent)

    def with_(self, **changes: Any) -> Config:
        return attrs.evolve(self, **changes)


OTEL_EXPORTERS = ("otlp", "console")
_OTLP_PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def _otel_traces(env: Mapping[str, str]) -> tuple[str, ...]:
    """The trace exporters OTEL_* configuration asks for: OTEL_TRACES_EXPORTER, else `otlp` when an OTLP
    endpoint is set; none when OTEL_SDK_DISABLED. Only OTLP over HTTP (http/protobuf) is shipped."""
    if boolean_or_false(env.get("OTEL_SDK_DISABLED", "")):
        return ()
    named = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip() or env.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
    if named:
        exporters = tuple(dict.fromkeys(part.strip() for part in named.split(",") if part.strip() != "none"))
        unknown = [name for name in exporters if name not in OTEL_EXPORTERS]
        if unknown:
            raise ConfigError(f"OTEL_TRACES_EXPORTER={named!r} is not a list of otlp, console or none")
    else:
        exporters = ("otlp",) if endpoint.strip() else ()
    name = next((n for n in _OTLP_PROTOCOLS if env.get(n, "").strip()), None)  # the traces' own one wins
    protocol = env.get(name, "").strip() if name else ""
    if "otlp" in exporters and name and protocol != "http/protobuf":
        raise ConfigError(f"{name}={protocol!r} is not supported: traces are exported as http/protobuf")
    return exporters


_VARIABLES: dict[str, tuple[str, Callable[[str], Any]]] = {
    "HOST": ("host", text),
    "PORT": ("port", integer(0, 65535)),
    "REDIS_URL": ("redis_url", redis_url),
    "REDIS_CLUSTER": ("redis_cluster", boolean),
    "REDIS_WAIT_REPLICAS": ("redis_wait_replicas", integer(0)),
    "REDIS_WAIT_TIMEOUT": ("redis_wait_timeout_ms", integer(1)),
    "DATA_DIR": ("data_dir", text),
    "HERMES_URL": ("hermes_url", urls),
    "HERMES_API_KEY": ("hermes_api_key", optional_text),
    "HERMES_TIMEOUT": ("hermes_timeout_ms", integer(1)),
    "HERMES_MAX_CONCURRENT": ("hermes_max_concurrent", integers(0)),
    "HERMES_AFFINITY_GRACE": ("hermes_affinity_grace_ms", integer(0)),
    "HERMES_UPSTREAM_LOST": ("hermes_upstream_lost_ms", integer(1)),
    "HERMES_MAX_BODY": ("hermes_max_body", integer(1)),
    "ADMISSION_FAIRNESS_DEFAULT": ("admission_fairness_default", choice(FAIRNESS_DEFAULTS)),
    "ADMISSION_FAIRNESS_WEIGHTS": ("admission_fairness_weights", weights),
    "ADMISSION_FAIRNESS_COST": ("admission_fairness_cost", choice(FAIRNESS_COSTS)),
    "ADMISSION_FAIRNESS_GUESS": ("admission_fairness_guess", integer(1)),
    "ADMISSION_QUOTAS": ("admission_quotas", parse_quotas),
    "ADMISSION_MAX_WAITING": ("admission_max_waiting", integer(0)),
    "REDIS_MEMORY_HIGH": ("redis_memory_high", share),
    "RUNS_SESSION_MULTITASK": ("runs_session_multitask", choice(MULTITASK)),
    "RUNS_SESSION_HISTORY": ("runs_session_history", boolean),
    "RUNS_SESSION_HISTORY_TURNS": ("runs_session_history_turns", integer(1)),
    "RUNS_CONCURRENCY": ("runs_concurrency", integer(1)),
    "RUNS_HOLD": ("runs_hold_ms", integer(0)),
    "RUNS_RESUBMIT": ("runs_resubmit", integer(0)),
    "RUNS_BACKOFF": ("runs_backoff_ms", integer(1)),
    "RUNS_BACKOFF_MAX": ("runs_backoff_max_ms", integer(1)),
    "RUNS_POLL_INTERVAL": ("runs_poll_interval_ms", integer(1)),
    "RUNS_LEASE": ("runs_lease_ms", integer(300)),
    "RUNS_EVENT_BLOCK": ("runs_event_block_ms", integer(1)),
    "RUNS_RETENTION": ("runs_retention_ms", integer(1)),
    "RUNS_DELTA_RETENTION": ("runs_delta_retention_ms", integer(0)),
    "RUNS_EVENTS_MAXLEN": ("runs_events_maxlen", integer(1)),
    "RUNS_PROXY_ENABLED": ("runs_proxy_enabled", boolean),
    "RUNS_APPROVAL_ALLOW_ALWAYS": ("runs_approval_allow_always", boolean),
    "SHUTDOWN_GRACE": ("shutdown_grace_ms", integer(0)),
    "BOARD_ENABLED": ("board_enabled", boolean),
    "BOARD_URL": ("board_url", optional_url),
    "BOARD_PLATFORM": ("board_platform", text),
    "BOARD_SIGNING_SECRET": ("board_signing_secrets", signing_secrets),
    "BOARD_RETRIES": ("board_retries", integer(1)),
    "BOARD_TIMEOUT": ("board_timeout_ms", integer(1)),
    "BOARD_REFRESH_INTERVAL": ("board_refresh_interval_ms", integer(0)),
    "BOARD_RECONCILE_INTERVAL": ("board_reconcile_interval_ms", integer(1)),
    "HERMES_TTL": ("hermes_ttl_ms", integer(1)),
    "CALLBACK_ALLOWED_HOSTS": ("callback_allowed_hosts", parse_hosts),
    "CALLBACK_SIGNING_SECRET": ("callback_signing_secrets", signing_secrets),
    "CALLBACK_RETRY_WINDOW": ("callback_retry_window_ms", integer(1)),
    "LOG_LEVEL": ("log_level", choice(LOG_LEVELS)),
    "LOG_FORMAT": ("log_format", choice(LOG_FORMATS)),
    "CONSOLE_ENABLED": ("console_enabled", boolean),
}

#: What each variable means, one line each: `python -m broker --help` prints it beside the default (the Config
#: field's); a test holds its names to `_VARIABLES`'.
MEANINGS: dict[str, str] = {
    "HOST": "address the broker listens on",
    "PORT": "port the broker listens on",
    "REDIS_URL": "Redis (redis://, rediss://, unix://); unset: an embedded redis-server under DATA_DIR",
    "REDIS_CLUSTER": "REDIS_URL names one node of a Redis Cluster; the broker discovers the rest",
    "REDIS_WAIT_REPLICAS": "acknowledge a write only once this many Redis replicas have it (WAIT)",
    "REDIS_WAIT_TIMEOUT": "longest wait for REDIS_WAIT_REPLICAS",
    "DATA_DIR": "where the embedded Redis keeps its files",
    "HERMES_URL": "Hermes API base URL; several, comma-separated, one per upstream",
    "HERMES_API_KEY": "bearer key of Hermes calls: one for all upstreams or a comma-separated list",
    "HERMES_MAX_BODY": "largest execution body a create may send to Hermes (bytes); larger creates answer 413",
    "HERMES_TIMEOUT": "per-request timeout of Hermes calls (not event streams)",
    "HERMES_MAX_CONCURRENT": "most live Hermes runs across replicas (one or one per upstream); 0: learn it",
    "HERMES_AFFINITY_GRACE": "how long a session waits for its upstream while it is down before it moves",
    "HERMES_UPSTREAM_LOST": "an upstream that answers nothing this long is lost: its live runs move",
    "ADMISSION_FAIRNESS_DEFAULT": "fairness key of a job that names none: session_key, session_id or none",
    "ADMISSION_FAIRNESS_WEIGHTS": "weights per fairness key, key=weight,key=weight (0 < weight <= 1000)",
    "ADMISSION_FAIRNESS_COST": "what a fairness key is charged per job: time (slot ms), tokens or runs",
    "ADMISSION_FAIRNESS_GUESS": "the charge of a key without history: ms of slot time (time) or tokens (tokens)",
    "ADMISSION_QUOTAS": 'JSON quotas per fairness key (live, waiting, tokens+window): {"default": {}, "keys": {}}',
    "ADMISSION_MAX_WAITING": "most jobs waiting in the line in all; past it creates answer 429 queue_full; 0: no bound",
    "REDIS_MEMORY_HIGH": "share of Redis's maxmemory past which creates answer 503",
    "RUNS_SESSION_MULTITASK": "what a new turn of a busy session does: enqueue, reject, interrupt or parallel",
    "RUNS_SESSION_HISTORY": "send a session's earlier completed turns to Hermes as conversation_history",
    "RUNS_SESSION_HISTORY_TURNS": "most earlier turns sent with RUNS_SESSION_HISTORY",
    "RUNS_CONCURRENCY": "jobs one replica drives at once",
    "RUNS_HOLD": "how long a job may wait for Hermes to accept it before it fails hold_expired",
    "RUNS_RESUBMIT": "resubmits of an interrupted job before it fails resubmit_exhausted",
    "RUNS_BACKOFF": "first busy/down retry backoff (exponential, with jitter)",
    "RUNS_BACKOFF_MAX": "longest busy/down retry backoff",
    "RUNS_POLL_INTERVAL": "status polling of a run whose event stream is gone",
    "RUNS_LEASE": "run lease TTL; a dead replica's jobs are taken over after it",
    "RUNS_EVENT_BLOCK": "an event stream's wait for its next event before a keepalive",
    "RUNS_RETENTION": "a job, its idempotency key and its events are kept this long after it ended",
    "RUNS_DELTA_RETENTION": "a finished job's message.delta events are kept this long; 0: as long as the job",
    "RUNS_EVENTS_MAXLEN": "stored events per job; past it message.delta events are counted, not stored",
    "RUNS_PROXY_ENABLED": "forward requests for ids that are not jobs to Hermes",
    "RUNS_APPROVAL_ALLOW_ALWAYS": "forward the approval choice always (it changes Hermes's allow-list)",
    "SHUTDOWN_GRACE": "drain budget on SIGTERM",
    "BOARD_ENABLED": "send board reports",
    "BOARD_URL": "board receiver endpoint (required when BOARD_ENABLED is true)",
    "BOARD_PLATFORM": "the platform field of every board report",
    "BOARD_SIGNING_SECRET": "space-separated Standard Webhooks secrets (whsec_...): deliveries are signed",
    "BOARD_RETRIES": "immediate delivery attempts per board report version",
    "BOARD_TIMEOUT": "per-delivery HTTP timeout (board reports and job callbacks)",
    "BOARD_REFRESH_INTERVAL": "activity-only refreshes of one thread are delivered at most this often",
    "BOARD_RECONCILE_INTERVAL": "board reconciliation (replay and repair) interval",
    "HERMES_TTL": "board entries expire this long after their source's last activity",
    "CALLBACK_ALLOWED_HOSTS": "hosts job callbacks may name, comma-separated (name or *.suffix); unset: refused",
    "CALLBACK_SIGNING_SECRET": "space-separated Standard Webhooks secrets (whsec_...): job callbacks are signed",
    "CALLBACK_RETRY_WINDOW": "how long one job callback delivery is retried",
    "LOG_LEVEL": "debug, info, warn or error",
    "LOG_FORMAT": "json or text",
    "CONSOLE_ENABLED": "serve the operator console at /console",
}


def unknown_variables(env: Mapping[str, str]) -> list[str]:
    """Variables of `env` with one of the broker's prefixes that it does not read, sorted."""
    return sorted(name for name in env if name.startswith(PREFIXES) and name not in _VARIABLES)
