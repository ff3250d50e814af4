"""What a runner needs (one `Deps` per replica), and how a runner's drive of a job ends."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from enum import StrEnum

from attrs import define, field

from broker.clock import Clock
from broker.driver.gate import Gate
from broker.hermes.client import HermesClient
from broker.hermes.fleet import Fleet
from broker.jobs.conversation import Conversations
from broker.jobs.policy import Policy
from broker.jobs.writer import Writer
from broker.metrics import Metrics
from broker.store.affinity import Affinity
from broker.store.leases import Leases


class Ending(StrEnum):
    FINISHED = "finished"  #: terminal (or expired): the job left the schedule
    QUEUED = "queued"  #: waiting in the admission line; the schedule wakes it when its hold expires
    PARKED = "parked"  #: the runner failed; the schedule retries the job soon
    LOST = "lost"  #: another replica owns the lease now
    PARKED_FOR_SESSION = "session"  #: an earlier turn of its session holds it (SPEC S4.3): out of the line until then
    #: it ended, but its last create got no answer and Hermes has not answered for that run yet: its session stays
    #: held (SPEC S4.3) and it is looked at again at `recheck_at`
    SETTLING = "settling"
    HELD = "held"  #: its key is at its quota or over its budget (SPEC S4.4): it waits out of the line, undriven


@define(kw_only=True)
class Deps:
    """What a runner needs; one instance per replica."""

    writer: Writer
    leases: Leases
    gate: Gate
    hermes: HermesClient
    clock: Clock
    metrics: Metrics
    policy: Policy
    poll_interval_ms: int
    jitter: Callable[[], float] = random.random
    upstream: str | None = None  #: the first upstream's name (SPEC S10): `hermes` talks to it
    fleet: Fleet | None = None  #: every upstream's client (SPEC S10); None: `hermes` only
    affinity: Affinity | None = None  #: where sessions' jobs go (SPEC S10); None: no affinity kept
    conversations: Conversations | None = None  #: sessions' turns in order (SPEC S4.3); None: not ordered
    #: runs this replica watches after losing their job (broker/driver/forsaken.py)
    background: set[asyncio.Task[None]] = field(factory=set)

    def client(self, upstream: str | None) -> HermesClient:
        """The Hermes client of `upstream` (the first's for None or an unknown name)."""
        return self.fleet.client_or_first(upstream) if self.fleet is not None else self.hermes
