"""The image's files and the image check's pure parts: compose.yaml's layout rules, the Dockerfile's promises,
reading an image's config and user (scripts/imagelib; the check itself runs in CI as scripts/image-check)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from image_check import check_config
from imagelib.common import CheckFailed
from imagelib.compose import problems, services_by_role
from imagelib.engine import ImageConfig
from imagelib.launch import resolve_user

REPO = Path(__file__).resolve().parents[2]


def compose_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "compose.yaml").read_text())
    return doc


def test_compose_yaml_has_redis_two_replicas_and_the_simulator() -> None:
    doc = compose_doc()

    assert problems(doc) == []
    assert services_by_role(doc) == {
        "redis": ["redis"],
        "simulator": ["simulator"],
        "brokers": ["broker-1", "broker-2"],
    }
    replicas = [doc["services"][name] for name in ("broker-1", "broker-2")]
    assert {replica["environment"]["REDIS_URL"] for replica in replicas} == {"redis://redis:6379/0"}
    assert doc["services"]["simulator"]["build"]["args"]["BASE_IMAGE"] == "${BASE_IMAGE:-python:3.11-slim}"


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Replaces (never mutates) the value at `services.<a>.<b>...`: the replicas share their anchors' objects."""

    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = doc["services"]
        for key in parents:
            node[key] = dict(node[key])
            node = node[key]
        if value is None:
            del node[last]
        else:
            node[last] = value

    return mutate


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (_set("redis.command", ["redis-server"]), "redis must run with --appendonly yes"),
        (_set("redis.volumes", None), "redis must keep /data (its AOF) on a named volume"),
        (_set("redis.image", "redis:6"), "redis must run redis:7"),
        (_set("broker-2", None), "want two broker replicas"),
        (_set("broker-2.environment.HERMES_URL", "http://elsewhere:8642"), "every replica's HERMES_URL"),
        (_set("broker-1.environment.REDIS_URL", "redis://127.0.0.1:6379/0"), "broker-1: REDIS_URL must name"),
        (_set("simulator.command", ["python", "-m", "broker.simulator"]), "simulator must listen on 0.0.0.0"),
        (_set("broker-1.stop_grace_period", "25s"), "broker-1: stop_grace_period must exceed SHUTDOWN_GRACE"),
        (_set("broker-2.image", "other:latest"), "broker-2 and simulator must run the same image"),
    ],
)
def test_compose_rules_name_what_is_missing(mutate: Callable[[dict[str, Any]], None], problem: str) -> None:
    doc = compose_doc()

    mutate(doc)

    found = problems(doc)
    assert any(line.startswith(problem) for line in found), found


def test_compose_rules_read_the_long_forms_too() -> None:
    doc = compose_doc()
    _set("redis.volumes", [{"type": "volume", "source": "redis-data", "target": "/data"}])(doc)
    _set("broker-1.ports", [{"target": 8080, "published": "8080"}])(doc)
    _set("broker-2.ports", None)(doc)
    _set("broker-1.environment", ["REDIS_URL=redis://redis:6379/0", "HERMES_URL=http://simulator:8642"])(doc)

    assert problems(doc) == []


def test_compose_rules_want_a_published_replica() -> None:
    doc = compose_doc()
    _set("broker-1.ports", None)(doc)
    assert problems(doc) == []  # one published replica is enough

    _set("broker-2.ports", None)(doc)

    assert problems(doc) == ["no replica publishes port 8080"]


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0], line.split(None, 1)[1]) for line in lines]


def test_dockerfile_takes_the_base_as_an_argument_and_runs_the_broker_as_broker() -> None:
    steps = dockerfile()

    assert steps[:2] == [("ARG", "BASE_IMAGE=python:3.11-slim"), ("FROM", "${BASE_IMAGE}")]
    assert ("USER", "broker") in steps
    assert ("VOLUME", '["/data"]') in steps
    assert ("EXPOSE", "8080") in steps
    assert json.loads(dict(steps)["CMD"]) == ["python", "-m", "broker"]  # exec form: the broker gets SIGTERM
    assert "DATA_DIR=/data" in dict(steps)["ENV"].split()


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    ignored = {line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()}
    copied = {word for step, args in dockerfile() if step == "COPY" for word in args.split()[:-1]}

    assert copied == {"pyproject.toml", "README.md", "broker", "projections"}
    assert not copied & ignored


INSPECT = {
    "Size": 259_000_000,
    "Config": {
        "User": "broker",
        "Env": ["PATH=/opt/venv/bin:/usr/bin:/bin", "DATA_DIR=/data", "EMPTY="],
        "Cmd": ["python", "-m", "broker"],
        "WorkingDir": "/app",
        "Volumes": {"/data": {}},
        "ExposedPorts": {"8080/tcp": {}},
        "StopSignal": "SIGTERM",
    },
}


def test_image_config_reads_what_podman_and_docker_inspect_print() -> None:
    config = ImageConfig.from_inspect(INSPECT)

    assert config.env == {"PATH": "/opt/venv/bin:/usr/bin:/bin", "DATA_DIR": "/data", "EMPTY": ""}
    assert config.argv() == ["python", "-m", "broker"]
    assert config.argv(["python", "-m", "broker.simulator"]) == ["python", "-m", "broker.simulator"]
    assert check_config(config).startswith("user broker, workdir /app, volume /data, port 8080/tcp")
    with_entrypoint = ImageConfig.from_inspect({"Config": {**INSPECT["Config"], "Entrypoint": ["tini", "--"]}})
    assert with_entrypoint.argv() == ["tini", "--", "python", "-m", "broker"]
    assert ImageConfig.from_inspect({"Config": {}}).user == "root"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"User": ""}, "user is 'root'"),
        ({"Cmd": ["/bin/sh", "-c", "python -m broker"]}, "command is"),
        ({"Volumes": None}, "volumes is []"),
        ({"Env": ["PATH=/usr/bin"]}, "DATA_DIR is None"),
    ],
)
def test_check_config_names_a_broken_promise(change: dict[str, Any], named: str) -> None:
    config = ImageConfig.from_inspect({"Config": {**INSPECT["Config"], **change}})

    with pytest.raises(CheckFailed) as failed:
        check_config(config)

    assert failed.value.check == "config"
    assert named in failed.value.reason


PASSWD = "root:x:0:0:root:/root:/bin/bash\nbroker:x:10001:10001::/app:/bin/sh\n"
GROUP = "root:x:0:\nbroker:x:10001:\nstaff:x:50:\n"


@pytest.mark.parametrize(
    ("user", "expected"),
    [
        ("broker", (10001, 10001, "/app")),
        ("10001", (10001, 10001, "/app")),
        ("broker:staff", (10001, 50, "/app")),
        ("4242", (4242, 0, "/")),
        ("4242:77", (4242, 77, "/")),
    ],
)
def test_resolve_user_reads_the_images_passwd_as_engines_do(user: str, expected: tuple[int, int, str]) -> None:
    assert resolve_user(user, PASSWD, GROUP) == expected


def test_resolve_user_fails_on_a_name_the_image_does_not_know() -> None:
    with pytest.raises(CheckFailed, match="'nobody' is not in its /etc/passwd"):
        resolve_user("nobody", PASSWD, GROUP)
    with pytest.raises(CheckFailed, match="'wheel' is not in its /etc/group"):
        resolve_user("broker:wheel", PASSWD, GROUP)
