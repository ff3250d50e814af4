"""The configuration as the startup log shows it: one line of the effective settings, and a warn line per
unknown variable with one of the broker's prefixes. Never a secret: no key, no signing secret, no password, no
URL with its credentials (hosts and names only)."""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

from broker.config import Config, unknown_variables
from broker.logging import get_logger

CONTEXT = "broker.config.Configuration"
REDIS_PORT = 6379  #: redis-py's when a redis:// URL names none
Fields = dict[str, str | int | float | bool]


def effective(config: Config, *, tracing: bool) -> Fields:
    """The settings an operator checks first, as root fields of the startup line."""
    fields: Fields = {
        "upstreams": ",".join(upstream.name for upstream in config.upstreams),
        "maxConcurrent": ",".join(str(limit) for limit in config.hermes_max_concurrent),
        "concurrency": config.runs_concurrency,
        **_redis(config),
        "board": config.board_enabled,
        "signing": bool(config.board_signing_secrets),
        "tracing": tracing,
        "retentionMs": config.runs_retention_ms,
        "deltaRetentionMs": config.runs_delta_retention_ms,
        "fairnessDefault": config.admission_fairness_default,
        "fairnessWeights": len(config.admission_fairness_weights),
        "fairnessCost": config.admission_fairness_cost,
        "fairnessGuess": config.admission_fairness_guess,
        "quotaKeys": len(config.admission_quotas.keys),
        "maxWaiting": config.admission_max_waiting,
        "proxy": config.runs_proxy_enabled,
        "console": config.console_enabled,
    }
    if config.board_url:
        fields["boardHost"] = _host(config.board_url)
    if config.callback_allowed_hosts:  # host names and patterns only; job callbacks are on (SPEC S5.8)
        fields["callbackHosts"] = ",".join(config.callback_allowed_hosts)
        fields["callbackSigning"] = bool(config.callback_signing_secrets)
    if tracing:
        fields["traceExporters"] = ",".join(config.otel_traces)
    return fields


def log_configuration(config: Config, env: Mapping[str, str], *, tracing: bool) -> None:
    log = get_logger(CONTEXT)
    log.info("Read the configuration.", extra=effective(config, tracing=tracing))
    for name in unknown_variables(env):
        # the name only: an unknown variable's value may well be a secret with a typo in its name
        log.warning("Ignored an unknown variable.", extra={"variable": name})


def _redis(config: Config) -> Fields:
    if config.redis_url is None:
        return {"redis": "embedded", "dataDir": config.data_dir}
    mode = "cluster" if config.redis_cluster else "single"
    fields: Fields = {"redis": mode, "redisNode": _host(config.redis_url, REDIS_PORT)}
    if config.redis_wait_replicas:
        fields["waitReplicas"] = config.redis_wait_replicas
        fields["waitTimeoutMs"] = config.redis_wait_timeout_ms
    return fields


def _host(url: str, default_port: int | None = None) -> str:
    """`host:port` of a URL (a unix socket's path), without its credentials, path or query."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        return parts.path
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"  # an IPv6 address
    try:
        port = parts.port or default_port
    except ValueError:
        port = None  # not a number: the host alone
    return f"{host}:{port}" if port else host
