"""The startup line's effective configuration (never a secret) and the unknown variables it warns about."""

from __future__ import annotations

import base64
import logging

import pytest

from broker.config import Config, unknown_variables
from broker.config_report import CONTEXT, effective, log_configuration

API_KEY = "hermes-key-4f1c"
PASSWORD = "redis-pass-9a2e"
BOARD_PASSWORD = "board-pass-77d0"
SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def _secret_laden() -> dict[str, str]:
    return {
        "HERMES_URL": f"http://user:{API_KEY}@hermes-1:8642,http://hermes-2:8642/agent",
        "HERMES_API_KEY": f",{API_KEY}",
        "REDIS_URL": f"redis://default:{PASSWORD}@redis-a:6380/0",
        "REDIS_CLUSTER": "true",
        "REDIS_WAIT_REPLICAS": "1",
        "BOARD_ENABLED": "true",
        "BOARD_URL": f"https://board:{BOARD_PASSWORD}@board.example/hook?token={BOARD_PASSWORD}",
        "BOARD_SIGNING_SECRET": SECRET,
        "ADMISSION_FAIRNESS_WEIGHTS": "tenant-a=2,tenant-b=0.5",
        "ADMISSION_FAIRNESS_COST": "time",
        "RUNS_DELTA_RETENTION": "0",
        "CALLBACK_ALLOWED_HOSTS": "hooks.example,*.example.org",
        "CALLBACK_SIGNING_SECRET": SECRET,
    }


def test_the_effective_configuration_names_hosts_and_modes_never_a_secret() -> None:
    fields = effective(Config.from_env(_secret_laden()), tracing=True)

    assert fields["upstreams"] == "hermes-1:8642,hermes-2:8642/agent"
    assert (fields["redis"], fields["redisNode"]) == ("cluster", "redis-a:6380")
    assert (fields["waitReplicas"], fields["waitTimeoutMs"]) == (1, 1000)
    assert (fields["board"], fields["boardHost"], fields["signing"]) == (True, "board.example", True)
    assert (fields["retentionMs"], fields["deltaRetentionMs"]) == (604_800_000, 0)
    assert (fields["fairnessDefault"], fields["fairnessWeights"]) == ("session_key", 2)
    assert (fields["fairnessCost"], fields["fairnessGuess"]) == ("time", 60_000)
    assert fields["tracing"] is True
    assert (fields["callbackHosts"], fields["callbackSigning"]) == ("hooks.example,*.example.org", True)
    shown = repr(fields)
    for secret in (API_KEY, PASSWORD, BOARD_PASSWORD, SECRET, SECRET.removeprefix("whsec_")):
        assert secret not in shown


def test_redis_modes() -> None:
    embedded = effective(Config(data_dir="/var/lib/runs"), tracing=False)
    assert (embedded["redis"], embedded["dataDir"], embedded["tracing"]) == ("embedded", "/var/lib/runs", False)
    assert "redisNode" not in embedded and "waitReplicas" not in embedded and "traceExporters" not in embedded
    single = effective(Config(redis_url="redis://10.0.0.5"), tracing=False)
    assert (single["redis"], single["redisNode"]) == ("single", "10.0.0.5:6379")
    socket = effective(Config(redis_url="unix:///run/redis.sock?password=x"), tracing=False)
    assert socket["redisNode"] == "/run/redis.sock"
    assert effective(Config(board_enabled=False), tracing=False)["board"] is False


def test_unknown_variables_are_those_with_a_broker_prefix_it_does_not_read() -> None:
    env = {
        "RUNS_TYPO": "1",
        "RUNS_HOLD": "1000",
        "HERMES_API_KEY": "k",
        "HERMES_APIKEY": "k",
        "CALLBACK_HOSTS": "x",
        "ADMISSION_QUOTA": "{}",
        "BOARD_URL": "http://b",
        "REDIS_PASSWORD": "p",
        "OTEL_SERVICE_NAME": "runs",
        "PATH": "/bin",
        "HOST": "0.0.0.0",
    }
    assert unknown_variables(env) == [
        "ADMISSION_QUOTA",
        "CALLBACK_HOSTS",
        "HERMES_APIKEY",
        "REDIS_PASSWORD",
        "RUNS_TYPO",
    ]


def test_quotas_of_live_runs_and_tokens_are_applied_without_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    # Given quotas of live runs and tokens beside a waiting quota
    raw = '{"default": {"waiting": 10, "live": 4}, "keys": {"batch": {"tokens": 1000, "window": "1h"}}}'
    config = Config.from_env({"ADMISSION_QUOTAS": raw, "ADMISSION_MAX_WAITING": "500"})
    # When the configuration is logged at startup
    with caplog.at_level(logging.INFO, logger=CONTEXT):
        log_configuration(config, {}, tracing=False)
    # Then nothing is warned about, and the startup line shows the bounds
    assert [record for record in caplog.records if record.levelno == logging.WARNING] == []
    assert effective(config, tracing=False)["maxWaiting"] == 500
    assert config.admission_quotas.enforced()


def test_a_waiting_quota_alone_is_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    config = Config.from_env({"ADMISSION_QUOTAS": '{"default": {"waiting": 10}}'})
    with caplog.at_level(logging.INFO, logger=CONTEXT):
        log_configuration(config, {}, tracing=False)
    assert not [record for record in caplog.records if record.levelno == logging.WARNING]
