"""Configuration (SPEC S2): every variable, its default and unit, and clear failures."""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import attrs
import pytest

from broker.admission.quotas import Quota, Quotas
from broker.board.due import DeliverySettings
from broker.config import Config
from broker.errors import ConfigError

KEY_A, KEY_B = bytes(range(24)), bytes(range(100, 132))
SECRET_A = "whsec_" + base64.b64encode(KEY_A).decode()  # 24 bytes: no padding
SECRET_B = "whsec_" + base64.b64encode(KEY_B).decode()  # 32 bytes: one '='

DEFAULTS = {
    "host": "0.0.0.0",
    "port": 8080,
    "redis_url": None,
    "redis_cluster": False,
    "redis_wait_replicas": 0,
    "redis_wait_timeout_ms": 1_000,
    "data_dir": "./data",
    "hermes_url": "http://127.0.0.1:8642",
    "hermes_api_key": None,
    "hermes_timeout_ms": 30_000,
    "hermes_max_concurrent": (0,),
    "hermes_affinity_grace_ms": 30_000,
    "hermes_upstream_lost_ms": 300_000,
    "hermes_max_body": 1_048_576,
    "admission_fairness_default": "session_key",
    "admission_fairness_weights": (),
    "admission_quotas": Quotas(),
    "admission_max_waiting": 0,
    "runs_session_multitask": "enqueue",
    "runs_session_history": False,
    "runs_session_history_turns": 50,
    "runs_concurrency": 64,
    "runs_hold_ms": 2_400_000,
    "runs_resubmit": 3,
    "runs_backoff_ms": 1_000,
    "runs_backoff_max_ms": 30_000,
    "runs_poll_interval_ms": 2_000,
    "runs_lease_ms": 15_000,
    "runs_event_block_ms": 15_000,
    "runs_retention_ms": 604_800_000,
    "runs_delta_retention_ms": 3_600_000,
    "runs_events_maxlen": 100_000,
    "runs_proxy_enabled": False,
    "runs_approval_allow_always": False,
    "shutdown_grace_ms": 25_000,
    "board_enabled": False,
    "board_url": None,
    "board_platform": "runs",
    "board_signing_secrets": (),
    "board_retries": 5,
    "board_timeout_ms": 10_000,
    "board_refresh_interval_ms": 60_000,
    "board_reconcile_interval_ms": 3_600_000,
    "hermes_ttl_ms": 86_400_000,
    "callback_allowed_hosts": (),
    "callback_signing_secrets": (),
    "callback_retry_window_ms": 86_400_000,
    "redis_memory_high": 0.9,
    "admission_fairness_cost": "time",
    "admission_fairness_guess": 60_000,
    "log_level": "info",
    "log_format": "json",
    "console_enabled": True,
    "otel_traces": (),
}

# variable -> (raw value, field, parsed value); every S2 variable, none at its default
EVERY_VARIABLE = {
    "HOST": ("127.0.0.1", "host", "127.0.0.1"),
    "PORT": ("9090", "port", 9090),
    "REDIS_URL": ("redis://10.0.0.1:6380/2", "redis_url", "redis://10.0.0.1:6380/2"),
    "REDIS_CLUSTER": ("true", "redis_cluster", True),
    "REDIS_WAIT_REPLICAS": ("1", "redis_wait_replicas", 1),
    "REDIS_WAIT_TIMEOUT": ("250", "redis_wait_timeout_ms", 250),
    "DATA_DIR": ("/var/lib/hbr", "data_dir", "/var/lib/hbr"),
    "HERMES_URL": ("https://hermes.internal:8642", "hermes_url", "https://hermes.internal:8642"),
    "HERMES_API_KEY": ("sekrit", "hermes_api_key", "sekrit"),
    "HERMES_TIMEOUT": ("1234", "hermes_timeout_ms", 1234),
    "HERMES_MAX_CONCURRENT": ("10", "hermes_max_concurrent", (10,)),
    "HERMES_AFFINITY_GRACE": ("5000", "hermes_affinity_grace_ms", 5000),
    "HERMES_UPSTREAM_LOST": ("60000", "hermes_upstream_lost_ms", 60_000),
    "HERMES_MAX_BODY": ("10000000", "hermes_max_body", 10_000_000),
    "ADMISSION_FAIRNESS_DEFAULT": ("session_id", "admission_fairness_default", "session_id"),
    "ADMISSION_FAIRNESS_WEIGHTS": (
        "team-a=3,team-b=0.5",
        "admission_fairness_weights",
        (("team-a", 3.0), ("team-b", 0.5)),
    ),
    "ADMISSION_FAIRNESS_COST": (" Tokens ", "admission_fairness_cost", "tokens"),
    "ADMISSION_FAIRNESS_GUESS": ("20000", "admission_fairness_guess", 20_000),
    "ADMISSION_QUOTAS": (
        '{"default": {"waiting": 100}, "keys": {"batch": {"waiting": 5, "live": 2, "tokens": 1000, "window": "1d"}}}',
        "admission_quotas",
        Quotas(Quota(waiting=100), (("batch", Quota(live=2, waiting=5, tokens=1000, window="1d")),)),
    ),
    "ADMISSION_MAX_WAITING": ("10000", "admission_max_waiting", 10_000),
    "REDIS_MEMORY_HIGH": ("0.75", "redis_memory_high", 0.75),
    "RUNS_SESSION_MULTITASK": ("Reject", "runs_session_multitask", "reject"),
    "RUNS_SESSION_HISTORY": ("true", "runs_session_history", True),
    "RUNS_SESSION_HISTORY_TURNS": ("5", "runs_session_history_turns", 5),
    "RUNS_CONCURRENCY": ("7", "runs_concurrency", 7),
    "RUNS_HOLD": ("60000", "runs_hold_ms", 60_000),
    "RUNS_RESUBMIT": ("5", "runs_resubmit", 5),
    "RUNS_BACKOFF": ("250", "runs_backoff_ms", 250),
    "RUNS_BACKOFF_MAX": ("9000", "runs_backoff_max_ms", 9000),
    "RUNS_POLL_INTERVAL": ("500", "runs_poll_interval_ms", 500),
    "RUNS_LEASE": ("3000", "runs_lease_ms", 3000),
    "RUNS_EVENT_BLOCK": ("800", "runs_event_block_ms", 800),
    "RUNS_RETENTION": ("1000", "runs_retention_ms", 1000),
    "RUNS_DELTA_RETENTION": ("0", "runs_delta_retention_ms", 0),
    "RUNS_EVENTS_MAXLEN": ("50", "runs_events_maxlen", 50),
    "RUNS_PROXY_ENABLED": ("true", "runs_proxy_enabled", True),
    "RUNS_APPROVAL_ALLOW_ALWAYS": ("true", "runs_approval_allow_always", True),
    "SHUTDOWN_GRACE": ("1000", "shutdown_grace_ms", 1000),
    "BOARD_ENABLED": ("true", "board_enabled", True),
    "BOARD_URL": ("https://board.example/hook", "board_url", "https://board.example/hook"),
    "BOARD_PLATFORM": ("gitlab", "board_platform", "gitlab"),
    "BOARD_SIGNING_SECRET": (SECRET_A, "board_signing_secrets", (KEY_A,)),
    "BOARD_RETRIES": ("2", "board_retries", 2),
    "BOARD_TIMEOUT": ("4000", "board_timeout_ms", 4000),
    "BOARD_REFRESH_INTERVAL": ("15000", "board_refresh_interval_ms", 15_000),
    "BOARD_RECONCILE_INTERVAL": ("600000", "board_reconcile_interval_ms", 600_000),
    "HERMES_TTL": ("3600000", "hermes_ttl_ms", 3_600_000),
    "CALLBACK_ALLOWED_HOSTS": (
        "hooks.example.com,*.example.org",
        "callback_allowed_hosts",
        ("hooks.example.com", "*.example.org"),
    ),
    "CALLBACK_SIGNING_SECRET": (SECRET_A, "callback_signing_secrets", (KEY_A,)),
    "CALLBACK_RETRY_WINDOW": ("3600000", "callback_retry_window_ms", 3_600_000),
    "LOG_LEVEL": ("debug", "log_level", "debug"),
    "LOG_FORMAT": ("text", "log_format", "text"),
    "CONSOLE_ENABLED": ("false", "console_enabled", False),
    "OTEL_TRACES_EXPORTER": ("console", "otel_traces", ("console",)),  # OpenTelemetry's own (SPEC S6.1)
}


def test_the_defaults_are_those_of_s2() -> None:
    assert attrs.asdict(Config.from_env({}), recurse=False) == DEFAULTS


def test_every_variable_parses() -> None:
    config = Config.from_env({name: raw for name, (raw, _, _) in EVERY_VARIABLE.items()})
    assert {field: getattr(config, field) for _, field, _ in EVERY_VARIABLE.values()} == {
        field: value for _, field, value in EVERY_VARIABLE.values()
    }
    assert set(attrs.asdict(config, recurse=False)) == {field for _, field, _ in EVERY_VARIABLE.values()}


@pytest.mark.parametrize("name", sorted(EVERY_VARIABLE))
def test_each_variable_alone_changes_only_its_field(name: str) -> None:
    raw, field, value = EVERY_VARIABLE[name]
    env = {name: raw}
    if name == "BOARD_ENABLED":
        env["BOARD_URL"] = "https://board.example/hook"
    if name == "REDIS_CLUSTER":
        env["REDIS_URL"] = "redis://10.0.0.1:7000"
    changed = attrs.asdict(Config.from_env(env), recurse=False)
    assert changed[field] == value
    companions = (field, "board_url", "redis_url")
    assert {k: v for k, v in changed.items() if k not in companions} == {
        k: v for k, v in DEFAULTS.items() if k not in companions
    }


@pytest.mark.parametrize(
    ("env", "exporters"),
    [
        ({}, ()),
        ({"OTEL_SERVICE_NAME": "broker", "OTEL_TRACES_SAMPLER": "always_on"}, ()),  # nothing says where to
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ("otlp",)),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, ("otlp",)),
        ({"OTEL_TRACES_EXPORTER": "console"}, ("console",)),
        ({"OTEL_TRACES_EXPORTER": "otlp, console"}, ("otlp", "console")),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ()),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, ()),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, ("otlp",)),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",  # the traces' own variable wins
            },
            ("otlp",),
        ),
    ],
)
def test_traces_are_on_only_when_otel_variables_ask_for_an_exporter(
    env: dict[str, str], exporters: tuple[str, ...]
) -> None:
    assert Config.from_env(env).otel_traces == exporters


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "PROTOCOL"),
    ],
)
def test_an_otel_exporter_the_broker_does_not_ship_stops_startup(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        Config.from_env(env)


def test_unknown_variables_are_not_read() -> None:
    assert Config.from_env({"RUNS_SOMETHING": "x", "PATH": "/bin"}) == Config()


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("PORT", "abc"),
        ("PORT", "80.5"),
        ("PORT", "-1"),
        ("HERMES_TIMEOUT", "30s"),
        ("HERMES_MAX_CONCURRENT", "-1"),
        ("HERMES_MAX_BODY", "0"),
        ("HERMES_MAX_BODY", "1MiB"),
        ("RUNS_CONCURRENCY", "0"),
        ("RUNS_SESSION_MULTITASK", "queue"),
        ("RUNS_SESSION_HISTORY_TURNS", "0"),
        ("RUNS_HOLD", ""),
        ("RUNS_RETENTION", "1e9"),
        ("RUNS_PROXY_ENABLED", "maybe"),
        ("BOARD_ENABLED", "2"),
        ("HERMES_URL", "localhost:8642"),
        ("HERMES_URL", "ftp://hermes"),
        ("HERMES_URL", "http://"),
        ("BOARD_URL", "board.example/hook"),
        ("REDIS_URL", "http://127.0.0.1:6379"),
        ("REDIS_CLUSTER", "sometimes"),
        ("REDIS_WAIT_REPLICAS", "-1"),
        ("REDIS_WAIT_TIMEOUT", "0"),
        ("LOG_LEVEL", "verbose"),
        ("LOG_FORMAT", "xml"),
        ("ADMISSION_FAIRNESS_DEFAULT", "user"),
        ("ADMISSION_FAIRNESS_DEFAULT", ""),
        ("ADMISSION_FAIRNESS_WEIGHTS", "team-a"),
        ("ADMISSION_FAIRNESS_WEIGHTS", "team-a=heavy"),
        ("ADMISSION_FAIRNESS_WEIGHTS", "team-a=0"),
        ("ADMISSION_FAIRNESS_WEIGHTS", "team-a=-1"),
        ("ADMISSION_FAIRNESS_WEIGHTS", "team-a=1001"),
        ("ADMISSION_FAIRNESS_WEIGHTS", "team-a=nan"),
        ("ADMISSION_FAIRNESS_WEIGHTS", "=2"),
        ("ADMISSION_FAIRNESS_COST", "seconds"),
        ("ADMISSION_FAIRNESS_COST", ""),
        ("ADMISSION_FAIRNESS_GUESS", "0"),
        ("ADMISSION_FAIRNESS_GUESS", "60s"),
        ("REDIS_MEMORY_HIGH", "0"),
        ("REDIS_MEMORY_HIGH", "1.01"),
        ("REDIS_MEMORY_HIGH", "-0.5"),
        ("REDIS_MEMORY_HIGH", "nan"),
        ("REDIS_MEMORY_HIGH", "90%"),
        ("REDIS_MEMORY_HIGH", ""),
        ("ADMISSION_MAX_WAITING", "-1"),
        ("ADMISSION_MAX_WAITING", "many"),
        ("ADMISSION_QUOTAS", "{"),
        ("ADMISSION_QUOTAS", '{"keys": {"a": {"waiting": 0}}}'),
    ],
)
def test_a_bad_value_names_its_variable(name: str, raw: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_env({name: raw})
    assert caught.value.message.startswith(f"{name}=")


def test_fairness_weights_keep_keys_with_equals_signs_and_the_last_weight_of_a_key() -> None:
    config = Config.from_env({"ADMISSION_FAIRNESS_WEIGHTS": " a=b=2 , c=1000,c=0.25,, "})
    assert config.admission_fairness_weights == (("a=b", 2.0), ("c", 0.25))
    assert Config.from_env({"ADMISSION_FAIRNESS_WEIGHTS": ""}).admission_fairness_weights == ()
    assert Config.from_env({"ADMISSION_FAIRNESS_DEFAULT": " None "}).admission_fairness_default == "none"


def test_board_enabled_needs_board_url() -> None:
    with pytest.raises(ConfigError, match="BOARD_URL"):
        Config.from_env({"BOARD_ENABLED": "true"})
    with pytest.raises(ConfigError, match="BOARD_URL"):
        Config.from_env({"BOARD_ENABLED": "true", "BOARD_URL": ""})


def test_a_cluster_needs_a_redis_url() -> None:
    with pytest.raises(ConfigError, match="REDIS_URL is required when REDIS_CLUSTER=true"):
        Config.from_env({"REDIS_CLUSTER": "true"})
    assert Config.from_env({"REDIS_CLUSTER": "true", "REDIS_URL": "redis://10.0.0.1:7000"}).redis_cluster


def test_an_empty_redis_url_means_embedded() -> None:
    assert Config.from_env({"REDIS_URL": ""}).redis_url is None


def test_the_api_key_is_never_printed() -> None:
    assert "sekrit" not in repr(Config.from_env({"HERMES_API_KEY": "sekrit"}))


def test_signing_secrets_are_space_separated_and_decoded_in_order() -> None:
    assert Config.from_env({"BOARD_SIGNING_SECRET": f" {SECRET_A}  {SECRET_B}\t"}).board_signing_secrets == (
        KEY_A,
        KEY_B,
    )
    assert Config.from_env({"BOARD_SIGNING_SECRET": SECRET_B}).board_signing_secrets == (KEY_B,)


def test_a_blank_signing_secret_means_unsigned() -> None:
    assert Config.from_env({"BOARD_SIGNING_SECRET": ""}).board_signing_secrets == ()
    assert Config.from_env({"BOARD_SIGNING_SECRET": "   "}).board_signing_secrets == ()


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (SECRET_A.removeprefix("whsec_"), "does not start with whsec_"),  # the bare base64
        ("WHSEC_" + SECRET_A.removeprefix("whsec_"), "does not start with whsec_"),
        ("whsk_" + SECRET_A.removeprefix("whsec_"), "does not start with whsec_"),  # an asymmetric key
        ("whsec_", "holds 0 key bytes"),  # an empty key
        ("whsec_not base64!", "(secret 1 of 2) is not standard base64"),  # two words: split at the space
        ("whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRY", "is not standard base64"),  # padding missing
        ("whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYX==", "is not standard base64"),  # padding where none goes
        ("whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRY*", "is not standard base64"),
        ("whsec_" + base64.urlsafe_b64encode(bytes(range(248, 255)) * 4).decode(), "is not standard base64"),
        ("whsec_" + base64.b64encode(bytes(23)).decode(), "holds 23 key bytes, not 24 to 64"),
        ("whsec_" + base64.b64encode(bytes(65)).decode(), "holds 65 key bytes, not 24 to 64"),
        (f"{SECRET_A} {SECRET_B} whsec_", "(secret 3 of 3) holds 0 key bytes"),
        (f"{SECRET_A} nope", "(secret 2 of 2) does not start with whsec_"),
    ],
)
def test_a_bad_signing_secret_names_the_variable_and_hides_the_value(raw: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_env({"BOARD_SIGNING_SECRET": raw})
    assert caught.value.message.startswith("BOARD_SIGNING_SECRET=<hidden> ")
    assert reason in caught.value.message
    reason_shown = caught.value.message.removeprefix("BOARD_SIGNING_SECRET=<hidden>")
    for word in raw.split():
        payload = word.removeprefix("whsec_")
        assert len(payload) < 8 or payload not in reason_shown


def test_the_signing_secrets_are_never_printed() -> None:
    config = Config.from_env({"BOARD_SIGNING_SECRET": f"{SECRET_A} {SECRET_B}"})
    for shown in (repr(config), str(config), repr(DeliverySettings.from_config(config.with_(board_url="http://b")))):
        assert SECRET_A[6:] not in shown and SECRET_B[6:] not in shown
        assert repr(KEY_A) not in shown and repr(KEY_B) not in shown


@pytest.mark.parametrize(
    ("name", "raw"),
    [
        ("PORT", "abc"),
        ("BOARD_ENABLED", "true"),
        ("HERMES_URL", "nope"),
        ("BOARD_SIGNING_SECRET", SECRET_A[6:]),
        ("ADMISSION_FAIRNESS_WEIGHTS", "a=0"),
        ("REDIS_MEMORY_HIGH", "2"),
        ("ADMISSION_QUOTAS", '{"default": {"waiting": 10},\n "keys": {"batch": {"waiting": "ten"}}}'),
    ],
)
def test_the_broker_exits_with_one_line_naming_the_variable(name: str, raw: str) -> None:
    env = {key: value for key, value in os.environ.items() if key not in EVERY_VARIABLE}
    env[name] = raw
    done = subprocess.run(
        [sys.executable, "-m", "broker"], env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode != 0
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    wanted = "BOARD_URL" if name == "BOARD_ENABLED" else name
    assert wanted in lines[0]
    if name == "BOARD_SIGNING_SECRET":
        assert raw not in lines[0]
    if name == "ADMISSION_QUOTAS":  # the path of the bad value in the JSON
        assert "keys.batch.waiting must be an integer of at least 1" in lines[0]


# --- several Hermes deployments (SPEC S10) ---


def test_one_hermes_url_is_one_upstream_with_the_whole_key_and_limit() -> None:
    config = Config.from_env(
        {"HERMES_URL": "http://hermes-1:8642/", "HERMES_API_KEY": "a,b", "HERMES_MAX_CONCURRENT": "7"}
    )
    (upstream,) = config.upstreams
    assert (upstream.index, upstream.name, upstream.url) == (0, "hermes-1:8642", "http://hermes-1:8642")
    assert (upstream.api_key, upstream.max_concurrent) == ("a,b", 7)  # one upstream: the key as it is, commas too
    assert Config().upstreams[0].name == "127.0.0.1:8642"
    assert Config().upstreams[0].api_key is None and Config().upstreams[0].max_concurrent == 0


def test_upstreams_are_named_by_their_url_without_scheme_or_credentials() -> None:
    config = Config.from_env({"HERMES_URL": " http://hermes-1:8642 , https://u:p@10.0.0.7:8642/agent/,http://h3"})
    assert [u.name for u in config.upstreams] == ["hermes-1:8642", "10.0.0.7:8642/agent", "h3"]
    assert [u.index for u in config.upstreams] == [0, 1, 2]
    assert config.upstreams[1].url == "https://u:p@10.0.0.7:8642/agent"  # the client keeps what it was given
    assert "u:p" not in repr(config.upstreams) and "u:p" not in repr(config)


def test_one_key_and_one_limit_are_for_every_upstream() -> None:
    config = Config.from_env(
        {"HERMES_URL": "http://a:1,http://b:1", "HERMES_API_KEY": "k", "HERMES_MAX_CONCURRENT": "4"}
    )
    assert [(u.api_key, u.max_concurrent) for u in config.upstreams] == [("k", 4), ("k", 4)]


def test_lists_give_each_upstream_its_own_key_and_limit_and_an_empty_key_item_is_no_key() -> None:
    env = {
        "HERMES_URL": "http://a:1,http://b:1,http://c:1",
        "HERMES_API_KEY": "ka,, kc ",
        "HERMES_MAX_CONCURRENT": "4, 6,0",
    }
    config = Config.from_env(env)
    assert [(u.api_key, u.max_concurrent) for u in config.upstreams] == [("ka", 4), (None, 6), ("kc", 0)]
    assert config.hermes_max_concurrent == (4, 6, 0)
    assert "ka" not in repr(config) and "kc" not in repr(config.upstreams)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"HERMES_URL": "http://a:1,http://b:1", "HERMES_API_KEY": "k1,k2,k3"}, "HERMES_API_KEY=<hidden> has 3"),
        ({"HERMES_URL": "http://a:1,http://b:1,http://c:1", "HERMES_API_KEY": "k1,k2"}, "HERMES_API_KEY=<hidden>"),
        ({"HERMES_URL": "http://a:1,http://b:1", "HERMES_MAX_CONCURRENT": "1,2,3"}, "HERMES_MAX_CONCURRENT="),
        ({"HERMES_MAX_CONCURRENT": "1,2"}, "HERMES_MAX_CONCURRENT='1,2' has 2 values, but HERMES_URL names 1"),
        ({"HERMES_MAX_CONCURRENT": "1,x"}, "HERMES_MAX_CONCURRENT='1,x' (item 2 of 2) is not an integer"),
        ({"HERMES_MAX_CONCURRENT": "1,-2"}, "HERMES_MAX_CONCURRENT="),
        ({"HERMES_URL": "http://a:1,"}, "HERMES_URL='http://a:1,' (item 2 of 2) is not an http(s) URL"),
        ({"HERMES_URL": "http://a:1,ftp://b"}, "HERMES_URL="),
        ({"HERMES_URL": "http://a:1,https://a:1/"}, "names the upstream a:1 twice"),
        ({"HERMES_URL": "http://x:y@a:1,http://a:1"}, "HERMES_URL='http://***@a:1,http://a:1' names"),
        ({"HERMES_URL": "http://x:y@a:1", "HERMES_API_KEY": "k1"}, "HERMES_URL carries user:password@"),
        ({"HERMES_URL": "http://a:1,http://x:y@b:1", "HERMES_API_KEY": "k1"}, "HERMES_URL (item 2 of 2) carries"),
        ({"HERMES_AFFINITY_GRACE": "-1"}, "HERMES_AFFINITY_GRACE="),
        ({"HERMES_UPSTREAM_LOST": "0"}, "HERMES_UPSTREAM_LOST="),
    ],
)
def test_a_bad_upstream_list_names_its_variable_and_hides_keys(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Config.from_env(env)
    assert named in caught.value.message
    assert "k1" not in caught.value.message and "x:y" not in caught.value.message


@pytest.mark.parametrize(
    ("env", "wanted"),
    [
        ({"HERMES_URL": "http://127.0.0.1:9,http://127.0.0.1:10", "HERMES_API_KEY": "s1,s2,s3"}, "HERMES_API_KEY"),
        ({"HERMES_URL": "http://127.0.0.1:9,http://127.0.0.1:10", "HERMES_MAX_CONCURRENT": "1,2,3"}, "HERMES_MAX"),
    ],
)
def test_the_broker_exits_with_one_line_naming_a_list_of_a_wrong_length(env: dict[str, str], wanted: str) -> None:
    started = {key: value for key, value in os.environ.items() if key not in EVERY_VARIABLE} | env
    done = subprocess.run(
        [sys.executable, "-m", "broker"], env=started, capture_output=True, text=True, timeout=30, check=False
    )
    assert done.returncode == 2
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert len(lines) == 1, lines
    assert wanted in lines[0] and "s1" not in lines[0] and "s2" not in lines[0]


def test_the_fairness_cost_settings_reach_the_cost_model() -> None:
    from broker.admission.cost import GUESS, CostMode, CostSettings

    assert CostSettings.from_config(Config()) == CostSettings(CostMode.TIME, GUESS)  # SPEC S2: `time`
    tokens = Config.from_env({"ADMISSION_FAIRNESS_COST": "tokens", "ADMISSION_FAIRNESS_GUESS": "5000"})
    assert CostSettings.from_config(tokens) == CostSettings(CostMode.TOKENS, 5000)
