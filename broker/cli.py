"""`python -m broker`'s command line: `--help` (every variable, its default and meaning) and `--version`.

The broker takes no other argument: the environment configures it (`broker.config`). Parsing exits 0 after
`--help` or `--version` and 2 with a usage line for anything else, before anything starts.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from importlib import metadata

import attrs

from broker.config import _VARIABLES, MEANINGS, PREFIXES, Config

PROG = "python -m broker"
DISTRIBUTION = "hermes-bridge-runs"
DESCRIPTION = """\
Runs the broker in front of Hermes Agent's /v1/runs API until SIGTERM (then drains).
It takes no arguments: the environment variables below configure it. An invalid value stops startup
with one line naming the variable; at startup it logs its effective configuration once."""


def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"  # run from a checkout that was never installed


def shown_default(value: object) -> str:
    """A Config default as the environment would spell it: `unset`, `true`/`false`, comma-separated lists."""
    if value is None or value == () or (not isinstance(value, bool | int | float | str) and not value):
        return "unset"  # an empty tuple, or no quotas
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(str(item) for item in value)
    return str(value)


def variables() -> list[tuple[str, str, str]]:
    """(name, default with its unit, meaning) of every variable the broker reads, in `_VARIABLES` order."""
    fields = attrs.fields_dict(Config)
    rows = []
    for name, (field, _parse) in _VARIABLES.items():
        default = shown_default(fields[field].default)
        if field.endswith("_ms") and default != "unset":
            default = f"{default} ms"
        rows.append((name, default, MEANINGS[name]))
    return rows


def variables_help() -> str:
    rows = variables()
    name_width = max(len(name) for name, _, _ in rows)
    default_width = max(len(default) for _, default, _ in rows)
    lines = ["environment variables (name, default, meaning):"]
    lines += [f"  {name:<{name_width}}  {default:<{default_width}}  {meaning}" for name, default, meaning in rows]
    lines += [
        f"  {'OTEL_*':<{name_width}}  {'unset':<{default_width}}  OpenTelemetry's own variables: traces (with the"
        " otel extra)",
        "",
        f"A variable starting with {', '.join(PREFIXES)} that is not listed here",
        "is named in a warn line at startup (a typo is not silent).",
    ]
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    layout = argparse.RawDescriptionHelpFormatter  # the table as written
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, epilog=variables_help(), formatter_class=layout
    )
    parser.add_argument("--version", action="version", version=f"{DISTRIBUTION} {version()}")
    return parser


def parse(argv: Sequence[str]) -> None:
    """Handle the command line: exits after `--help`/`--version` (0) or an unknown argument (2)."""
    parser().parse_args(list(argv))
