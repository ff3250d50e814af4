"""`python -m broker --help`: every variable the config module reads, with its default and a one-line meaning."""

from __future__ import annotations

import attrs

from broker import cli
from broker.config import _VARIABLES, MEANINGS, Config


def test_every_variable_the_config_reads_has_a_one_line_meaning() -> None:
    # a variable added to the config without a meaning (or a meaning left for a removed one) fails here
    assert set(MEANINGS) == set(_VARIABLES)
    for name, meaning in MEANINGS.items():
        assert meaning.strip() and "\n" not in meaning, name


def test_the_help_lists_every_variable_once_with_its_default_and_meaning() -> None:
    text = cli.variables_help()
    rows = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ")}
    assert set(_VARIABLES) <= set(rows)
    for name, default, meaning in cli.variables():
        assert rows[name].split(None, 1)[1].startswith(default), name
        assert rows[name].endswith(meaning), name
    # defaults are the Config class's, spelled as the environment would be, durations with their unit
    assert rows["RUNS_HOLD"].split()[1:3] == [str(Config().runs_hold_ms), "ms"]
    assert rows["REDIS_URL"].split()[1] == "unset"
    assert rows["CONSOLE_ENABLED"].split()[1] == "true"
    assert rows["BOARD_ENABLED"].split()[1] == "false"
    assert rows["HERMES_MAX_CONCURRENT"].split()[1] == "0"
    assert rows["BOARD_SIGNING_SECRET"].split()[1] == "unset"
    assert "OTEL_*" in rows


def test_defaults_are_shown_as_the_environment_spells_them() -> None:
    assert [cli.shown_default(value) for value in (None, (), True, False, (4, 8), 0.9, "./data")] == [
        "unset",
        "unset",
        "true",
        "false",
        "4,8",
        "0.9",
        "./data",
    ]


def test_every_variable_names_a_config_field() -> None:
    fields = attrs.fields_dict(Config)
    assert all(field in fields for field, _parse in _VARIABLES.values())
