"""Each replica's share of the upstreams' health (SPEC S10): it reports what its own calls met, probes an upstream
whose calls fail (one probe at a time across the replicas), and stops the runs a returning upstream still holds
for jobs that moved on while it was lost.

What a call met is recorded by the Hermes client (`heard`, broker/upstreams/health.py); this loop merges it into
the shared health only when that changes something (a streak began or ended), so a healthy fleet costs one read
per upstream per tick. An upstream that nobody heard from for a while is asked too (one replica at a time), so one
that died or froze while idle reads unreachable within seconds rather than "up" until a job goes there. A lone
upstream is watched the same way, for what /readyz, /metrics and the console show; it is never lost (there is
nowhere to move its runs to).
"""

from __future__ import annotations

import asyncio

from broker.clock import Clock
from broker.hermes.client import HermesClient
from broker.hermes.fleet import Fleet
from broker.hermes.models import NotFound, Rejected, Stopping
from broker.logging import get_logger
from broker.store.outage import log_failure
from broker.store.upstream_health import HealthStore
from broker.upstreams.health import Health, Heard, Reach, probe_gap, reach, report_due

#: How often each replica looks at the upstreams' health.
TICK_S = 1.0
#: A failing upstream is probed this often (by one replica), at most; never less than four times per lost window.
PROBE_INTERVAL_MS = 2_000
#: An upstream that no call of this replica's, and no report of the others', found answering for this long is probed
#: (by one replica at a time); never less than twice per lost window.
IDLE_PROBE_MS = 10_000
#: The run id a health probe asks for: any answer of Hermes's (a 404 envelope) says it is up.
PROBE_RUN = "hbr-health-probe"


class Prober:
    def __init__(self, fleet: Fleet, store: HealthStore, *, lost_ms: int) -> None:
        self._fleet = fleet
        self._store = store
        self._lost_ms = lost_ms if len(fleet) > 1 else 0  #: 0: a lone upstream, never lost
        self._interval_ms = max(100, min(PROBE_INTERVAL_MS, lost_ms // 4))
        self._idle_ms = max(self._interval_ms, min(IDLE_PROBE_MS, lost_ms // 2))
        self._refresh_ms = max(1_000, lost_ms // 2)  #: the stored answer never gets older than this while it answers
        self._reported: dict[str, Heard] = {}
        self._shared: dict[str, Health] = {}
        self._reached: dict[str, Reach] = {}
        self._idle_asked: dict[str, int] = {}  #: when this replica last asked to probe an idle upstream
        self._log = get_logger(type(self))

    async def run(self, clock: Clock) -> None:
        """Look at every upstream for ever, each in its own loop: a probe of a frozen one waits out its timeout
        without holding up the others."""

        async def watch(name: str, client: HermesClient) -> None:
            while True:  # a look that fails is logged here: a watch never ends but by its cancel, so no sibling of a
                try:  # failed one is left running on its own, past the stop that cancels the others
                    await self._look(name, client, clock.now_ms())
                except Exception as error:
                    outage, bug = "Lost Redis looking at an upstream.", "Could not look at an upstream."
                    log_failure(self._log, error, outage=outage, bug=bug, upstream=name)
                await asyncio.sleep(self._pause(name, clock.now_ms()))

        await asyncio.gather(*(watch(upstream.name, client) for upstream, client in self._fleet))

    async def tick(self, now_ms: int) -> None:
        """One look at every upstream, at once."""
        await asyncio.gather(*(self._look(upstream.name, client, now_ms) for upstream, client in self._fleet))

    async def _look(self, name: str, client: HermesClient, now_ms: int) -> None:
        shared = await self._report(name, client)
        due = shared.failing or self._idle(name, getattr(client, "heard", Heard()), shared, now_ms)
        gap = probe_gap(shared, now_ms, self._interval_ms) if shared.failing else self._interval_ms
        if due and await self._store.claim_probe(name, now_ms, now_ms + gap):
            await client.get(PROBE_RUN)  # its answer (or none) is recorded by the client
            shared = await self._report(name, client)
        self._shared[name] = shared
        now = self._reach(shared, now_ms)
        before = self._reached.get(name, Reach.UP)
        self._reached[name] = now
        if now is not before:
            fields = {"upstream": name, "since": shared.failing_since_ms or None}
            if now is Reach.LOST:
                self._log.warning("Lost an upstream: its runs move to the others.", extra=fields)
            elif now is Reach.UNREACHABLE and before is Reach.UP:
                self._log.warning("An upstream stopped answering.", extra=fields)
            elif now is Reach.UP:
                self._log.info("An upstream answers again.", extra={"upstream": name})
        if now is Reach.UP:
            await self._stop_orphans(name, client)

    def _pause(self, name: str, now_ms: int) -> float:
        """Seconds to the next look: a tick, or the next probe's gap while the upstream fails (a brief fault)."""
        shared = self._shared.get(name)
        if shared is None or not shared.failing:
            return TICK_S
        return min(TICK_S, probe_gap(shared, now_ms, self._interval_ms) / 1000)

    def _idle(self, name: str, heard: Heard, shared: Health, now_ms: int) -> bool:
        """Nobody heard from it for a while: is this replica to ask for the probe? (once per interval at most)"""
        if now_ms - max(heard.answered_ms, shared.answered_ms) < self._idle_ms:
            return False
        if now_ms < self._idle_asked.get(name, 0) + self._interval_ms:
            return False
        self._idle_asked[name] = now_ms
        return True

    def _reach(self, shared: Health, now_ms: int) -> Reach:
        if self._lost_ms > 0:
            return reach(shared, now_ms, self._lost_ms)
        return Reach.UNREACHABLE if shared.failing else Reach.UP

    async def _report(self, name: str, client: HermesClient) -> Health:
        heard: Heard = getattr(client, "heard", Heard())
        reported = self._reported.get(name, Heard())
        shared = self._shared.get(name)
        if shared is None or report_due(heard, reported, shared, self._refresh_ms):
            shared = await self._store.report(name, heard)
            self._reported[name] = heard
            return shared
        return await self._store.read(name)

    async def _stop_orphans(self, name: str, client: HermesClient) -> None:
        """Runs it held for jobs that moved on while it was lost: stop them, so none keeps running (SPEC S10). Looked
        at every tick while it answers (one read), so a stop that failed, an orphan recorded late and a long list are
        all taken in turn."""
        for run_id in await self._store.orphans(name):
            outcome = await client.stop(run_id)
            if isinstance(outcome, Stopping | NotFound | Rejected):  # stopped, gone, or no longer active
                await self._store.settled(name, run_id)
                fields = {"upstream": name, "hermesRun": run_id}
                self._log.info("Stopped a run left on a returning upstream.", extra=fields)
