"""The scripts' `--help` layout: descriptions as written, and the default of every option that takes a value."""

from __future__ import annotations

import argparse


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """`(default: X)` after an option's help, unless its help already names the default (a None default has
    to: say what leaving it out means); flags (`--write`) are off unless given and show none."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default is None or action.nargs == 0:
            return text
        return super()._get_help_string(action)
