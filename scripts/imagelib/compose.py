"""compose.yaml's layout, checked: by a compose tool's `config` (`docker compose`, `podman-compose`, else
podman-compose from PyPI in a virtualenv under the cache) and always by `problems()`, which the unit tests run too."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from imagelib.base import cache_dir
from imagelib.common import CheckFailed, last_line

PODMAN_COMPOSE = "podman-compose==1.6.0"  #: the first podman-compose the check was tried with that has `config`
SHUTDOWN_GRACE_S = 25  #: SPEC S2's default: a replica must get longer than this to drain before it is killed


def validate(path: Path) -> str:
    """One line for the report; fails the `compose` check on any problem."""
    checked_by = run_tool(path)
    try:
        import yaml  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise CheckFailed("compose", "no YAML parser to read compose.yaml: pip install -e '.[dev]' (PyYAML)") from None
    found = problems(yaml.safe_load(path.read_text()))
    if found:
        raise CheckFailed("compose", f"{path.name}: " + "; ".join(found))
    roles = services_by_role(yaml.safe_load(path.read_text()))
    layout = f"redis {roles['redis'][0]}, replicas {', '.join(roles['brokers'])}, simulator {roles['simulator'][0]}"
    return f"{path.name}: {layout} ({checked_by})"


def run_tool(path: Path) -> str:
    """Has a compose tool with a `config` command parse the file (interpolation, merge keys, the schema).
    podman-compose before 1.0.4 has none, and its `--dry-run up` creates volumes and networks: never used."""
    tools = [tool for tool in (["docker", "compose"], ["podman-compose"], ["docker-compose"]) if _has_config(tool)]
    tool = tools[0] if tools else cached_podman_compose()
    if tool is None:
        return "parsed and checked against the layout rules; no compose tool with `config` could be had"
    argv = [*tool, "-f", str(path), "config"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise CheckFailed("compose", f"`{' '.join(argv)}` rejects it: {last_line(done.stderr or done.stdout)}")
    name = " ".join(tool) if tools else f"{PODMAN_COMPOSE} (cached)"
    return f"`{name} config` and the layout rules"


def cached_podman_compose() -> list[str] | None:
    """podman-compose from PyPI in a virtualenv under the check's cache; None when it cannot be installed."""
    venv = cache_dir() / "podman-compose"
    program, complete = venv / "bin" / "podman-compose", venv / ".complete"  # written last: a whole install
    if complete.exists():
        return [str(program)]
    shutil.rmtree(venv, ignore_errors=True)
    pip = [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", PODMAN_COMPOSE]
    try:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120)
        subprocess.run(pip, check=True, capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError):
        shutil.rmtree(venv, ignore_errors=True)
        return None
    complete.touch()
    return [str(program)]


def _has_config(tool: list[str]) -> bool:
    if shutil.which(tool[0]) is None:
        return False
    try:  # `docker compose` is a plugin the client may lack; old podman-compose lacks `config`
        version = subprocess.run([*tool, "version"], capture_output=True, timeout=30)
        usage = subprocess.run([*tool, "--help"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return version.returncode == 0 and re.search(r"\bconfig\b", usage.stdout) is not None


def services_by_role(doc: dict[str, Any]) -> dict[str, list[str]]:
    """Redis (a redis image), the simulator (runs broker.simulator), the broker replicas (the rest)."""
    roles: dict[str, list[str]] = {"redis": [], "simulator": [], "brokers": []}
    for name, service in (doc.get("services") or {}).items():
        if str(service.get("image", "")).startswith("redis:"):
            roles["redis"].append(name)
        elif "broker.simulator" in _words(service.get("command")):
            roles["simulator"].append(name)
        else:
            roles["brokers"].append(name)
    return roles


def problems(doc: dict[str, Any]) -> list[str]:
    """What compose.yaml must say (docs/operations/image.md); an empty list when it says all of it."""
    roles = services_by_role(doc)
    if len(roles["redis"]) != 1 or len(roles["simulator"]) != 1:
        return [f"want one redis and one simulator service, found {roles}"]
    services = doc["services"]
    redis_name, simulator_name = roles["redis"][0], roles["simulator"][0]
    found = _redis_problems(redis_name, services[redis_name], doc.get("volumes") or {})
    simulator = services[simulator_name]
    if _flag(_words(simulator.get("command")), "--host") != "0.0.0.0":
        found.append(f"{simulator_name} must listen on 0.0.0.0 (--host 0.0.0.0) to be reached by the replicas")
    if len(roles["brokers"]) < 2:
        found.append(f"want two broker replicas, found {roles['brokers']}")
    hermes_urls = set()
    for name in roles["brokers"]:
        service = services[name]
        env = _environment(service)
        if not re.fullmatch(rf"redis://{re.escape(redis_name)}:6379(/\d+)?", env.get("REDIS_URL", "")):
            found.append(f"{name}: REDIS_URL must name the {redis_name} service, not {env.get('REDIS_URL')!r}")
        hermes_urls.add(env.get("HERMES_URL", ""))
        if service.get("image") != simulator.get("image") or not service.get("image"):
            found.append(f"{name} and {simulator_name} must run the same image")
        if _seconds(service.get("stop_grace_period", "10s")) <= SHUTDOWN_GRACE_S:
            found.append(f"{name}: stop_grace_period must exceed SHUTDOWN_GRACE ({SHUTDOWN_GRACE_S} s) to drain")
    if hermes_urls != {f"http://{simulator_name}:8642"}:
        found.append(f"every replica's HERMES_URL must be http://{simulator_name}:8642, found {sorted(hermes_urls)}")
    if not any(_publishes_8080(services[name]) for name in roles["brokers"]):
        found.append("no replica publishes port 8080")
    return found


def _redis_problems(name: str, redis: dict[str, Any], volumes: dict[str, Any]) -> list[str]:
    found = []
    if not str(redis.get("image")).startswith("redis:7"):
        found.append(f"{name} must run redis:7, not {redis.get('image')!r}")
    if _flag(_words(redis.get("command")), "--appendonly") != "yes":
        found.append(f"{name} must run with --appendonly yes")
    mounts = [
        [str(volume.get("source")), str(volume.get("target"))] if isinstance(volume, dict) else str(volume).split(":")
        for volume in redis.get("volumes") or []
    ]  # short (`name:/data`) or long form (`{source: name, target: /data}`)
    if not any(len(parts) >= 2 and parts[1] == "/data" and parts[0] in volumes for parts in mounts):
        found.append(f"{name} must keep /data (its AOF) on a named volume")
    return found


def _words(command: Any) -> list[str]:
    if isinstance(command, list):
        return [str(word) for word in command]
    return str(command or "").split()


def _flag(words: list[str], flag: str) -> str | None:
    """The value after `flag` in a command, or None."""
    return words[words.index(flag) + 1] if flag in words[:-1] else None


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        return dict(str(item).split("=", 1) for item in env if "=" in str(item))
    return {str(key): str(value) for key, value in env.items()}


def _seconds(duration: Any) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(duration))
    return sum(float(number) * units[unit] for number, unit in parts)


def _publishes_8080(service: dict[str, Any]) -> bool:
    for port in service.get("ports") or []:
        target = port.get("target") if isinstance(port, dict) else str(port).rsplit(":", 1)[-1].split("/")[0]
        if str(target) == "8080":
            return True
    return False
