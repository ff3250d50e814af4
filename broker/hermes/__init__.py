"""Outbound Hermes HTTP: the `HermesClient` port, its aiohttp implementation and the typed outcomes."""

from broker.hermes.client import AiohttpHermesClient, HermesClient
from broker.hermes.models import (
    Accepted,
    Busy,
    Comment,
    Draining,
    Forwarded,
    HermesEvent,
    HermesRun,
    NotFound,
    Rejected,
    Relayed,
    Stopping,
    StreamEnded,
    Unauthorized,
    Unavailable,
)

__all__ = [
    "Accepted",
    "AiohttpHermesClient",
    "Busy",
    "Comment",
    "Draining",
    "Forwarded",
    "HermesClient",
    "HermesEvent",
    "HermesRun",
    "NotFound",
    "Rejected",
    "Relayed",
    "Stopping",
    "StreamEnded",
    "Unauthorized",
    "Unavailable",
]
