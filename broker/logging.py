"""The S6 log contract: one line per event, a fixed sentence, ids and numbers as root fields."""

from __future__ import annotations

import logging
import sys
from typing import Any

from pythonjsonlogger.orjson import OrjsonFormatter

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}
_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn", logging.ERROR: "error"}
# Attributes every LogRecord has; anything else on a record came from `extra=` and is a field.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "level"}


class _LevelFilter(logging.Filter):
    """Names levels as the contract does (`warn`, not `WARNING`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.level = _NAMES.get(record.levelno, "error" if record.levelno > logging.ERROR else "debug")
        return True


class _ReplicaFilter(logging.Filter):
    """Gives every line the process's replica id (`replica`), unless the line names one itself."""

    def __init__(self, replica: str) -> None:
        super().__init__()
        self._replica = replica

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "replica"):
            record.replica = self._replica
        return True


class TextFormatter(logging.Formatter):
    """`LOG_FORMAT=text`: the same fields inline, `key=value` after the sentence."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD)
        line = f"{self.formatTime(record)} {record.__dict__.get('level', 'info')} [{record.name}] {record.getMessage()}"
        if fields:
            line = f"{line} {fields}"
        if record.exc_info:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


def configure(level: str = "info", fmt: str = "json", replica: str | None = None) -> None:
    """Route every logger of the process to stdout in the contract's format; with `replica`, every line carries it
    (the id a job this process drives shows as its `owner`)."""
    handler = logging.StreamHandler(sys.stdout)
    handler.addFilter(_LevelFilter())
    if replica is not None:
        handler.addFilter(_ReplicaFilter(replica))
    if fmt == "text":
        handler.setFormatter(TextFormatter())
    else:
        handler.setFormatter(
            OrjsonFormatter(
                "{level}{message}{name}",
                style="{",
                rename_fields={"name": "context"},
                timestamp="time",
            )
        )
    # What no line shows is not gathered per record (the logging HOWTO's "Optimization"): the caller's frame,
    # thread and process (the lines carry the fields of the format and `extra=` only, S6).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS[level])
    # aiohttp's own access log is replaced by our request line (S6).
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def get_logger(owner: type[Any] | str) -> logging.Logger:
    """Logger named for the source class (`context` of each line)."""
    if isinstance(owner, str):
        return logging.getLogger(owner)
    return logging.getLogger(f"{owner.__module__}.{owner.__qualname__}")
