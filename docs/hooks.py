"""MkDocs hook: renders the configuration reference from `broker/config.py`, so the page cannot drift from it.

A page that holds the line `<!-- config-reference -->` gets, in its place, one table row per variable the
broker reads: name, default (with its unit) and meaning, from the same source as `python -m broker --help`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- config-reference -->"


def config_table() -> str:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # build from a checkout, installed or not
    from broker.cli import variables

    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for name, default, meaning in variables():
        rows.append(f"| `{name}` | `{default}` | {meaning.replace('|', '&#124;')} |")
    rows.append("| `OTEL_*` | `unset` | OpenTelemetry's own variables: traces, with the `otel` extra |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, config_table())
