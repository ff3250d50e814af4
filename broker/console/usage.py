"""The console's usage page (SPEC S4.5, S8): the keys that used most Hermes time over the last 24 h and 7 d, as a bar
chart drawn on the server (inline SVG: no script, no external asset) and a table of their totals."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from attrs import frozen

from broker.http import appkeys
from broker.jobs.usage_report import DAY_S, KeyTotal, Range, record, top_keys

WINDOWS = (("24 h", DAY_S), ("7 d", 7 * DAY_S))
SHOWN_KEYS = 10  #: keys per chart
BAR_HEIGHT = 22  #: px per key in the chart
LABEL_WIDTH = 180  #: px of the keys' names left of the bars
BARS_WIDTH = 420  #: px of the longest bar
KEY_CHARS = 28  #: of a key's name in the chart (the table shows it whole)


@frozen
class Bar:
    key: str
    label: str  #: the key as the chart shows it
    seconds: float
    y: int
    width: int
    totals: dict[str, int | float]


@frozen
class Chart:
    name: str  #: `24 h` or `7 d`
    bars: list[Bar]
    height: int
    width: int = LABEL_WIDTH + BARS_WIDTH + 90


def chart(name: str, ranked: list[KeyTotal]) -> Chart:
    """The bars of one window: the longest fills the chart, the others in proportion."""
    most = max((item.hermes_seconds for item in ranked), default=0.0)
    bars = []
    for index, item in enumerate(ranked):
        label = item.key if item.key else "(none)"
        label = label if len(label) <= KEY_CHARS else label[: KEY_CHARS - 1] + "…"
        width = round(BARS_WIDTH * item.hermes_seconds / most) if most > 0 else 0
        bars.append(Bar(item.key, label, item.hermes_seconds, index * BAR_HEIGHT, max(width, 1), record(item.counters)))
    return Chart(name, bars, max(len(bars), 1) * BAR_HEIGHT)


async def usage_page(app: web.Application) -> dict[str, Any]:
    now_ms = app[appkeys.clock_key].now_ms()
    retention_ms = app[appkeys.config_key].runs_retention_ms
    charts = []
    for name, seconds in WINDOWS:
        hours = Range(since_s=now_ms / 1000 - seconds, until_s=now_ms / 1000).hours(now_ms, retention_ms)
        charts.append(chart(name, await top_keys(app[appkeys.usage_key], hours, SHOWN_KEYS)))
    return {"charts": charts, "label_width": LABEL_WIDTH}
