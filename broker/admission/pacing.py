"""How the admission store paces refusals and slots: the S2 numbers it runs by (SPEC S4.1, S10)."""

from __future__ import annotations

from attrs import frozen

from broker.admission.state import QUIET_MS
from broker.config import Config


@frozen(kw_only=True)
class Pacing:
    """How refusals are paced (S2 `RUNS_BACKOFF`/`RUNS_BACKOFF_MAX`) and whether the limit is pinned."""

    pinned: int = 0  #: HERMES_MAX_CONCURRENT; 0 = learnt
    slot_ttl_ms: int = 15_000  #: RUNS_LEASE
    backoff_ms: int = 1_000
    backoff_max_ms: int = 30_000
    quiet_ms: int = QUIET_MS
    affinity_grace_ms: int = 30_000  #: HERMES_AFFINITY_GRACE (SPEC S10)
    upstream_lost_ms: int = 300_000  #: HERMES_UPSTREAM_LOST (SPEC S10)

    @classmethod
    def from_config(cls, config: Config) -> Pacing:
        return cls(
            pinned=config.upstreams[0].max_concurrent,  # an AdmissionStore given no upstreams (each has its own)
            slot_ttl_ms=config.runs_lease_ms,
            backoff_ms=config.runs_backoff_ms,
            backoff_max_ms=config.runs_backoff_max_ms,
            affinity_grace_ms=config.hermes_affinity_grace_ms,
            upstream_lost_ms=config.hermes_upstream_lost_ms,
        )
