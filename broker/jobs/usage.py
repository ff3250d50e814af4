"""Every replica's usage sweep (SPEC S4.5): the usage facts job writes left in their partitions are counted in their
hours' buckets, then taken off. Two replicas may take the same fact; its hour's markers count it once, and only the
replica that counted it adds it to its /metrics totals (so the totals of all replicas add up to the buckets). Under
ADMISSION_FAIRNESS_COST time or tokens the facts of settled runs whose charge is still in flight are settled too
(`settle`: a crash or an outage between a run's job write and its settle, SPEC S4.2 "What a turn costs")."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence

from broker.logging import get_logger
from broker.metrics import Metrics
from broker.store.budgets import Budgets
from broker.store.outage import is_outage, outage_name
from broker.store.usage import BATCH, UsageStore
from broker.tasks import cancel_all
from projections.usage import Used

SWEEP_S = 1.0  #: how often a replica looks at the partitions (a settled run shows in /v1/usage about this late)


class UsageSweep:
    def __init__(
        self,
        store: UsageStore,
        metrics: Metrics,
        *,
        every_s: float = SWEEP_S,
        budgets: Budgets | None = None,
        settle: Callable[[Sequence[Used]], Awaitable[None]] | None = None,
    ) -> None:
        self._store = store
        self._budgets = budgets  #: the keys' token budgets (SPEC S4.4) add the tokens of the runs counted here
        #: the runs the facts settle whose charge their job write's settle left in flight (JobStore.settle_missed)
        self._settle = settle
        self._metrics = metrics
        self._every_s = every_s
        self._task: asyncio.Task[None] | None = None
        self._more = False  #: the last pass took a full batch of some partition: more may wait
        self._log = get_logger(UsageSweep)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="usage-sweep")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_all([self._task])
            self._task = None

    async def sweep(self) -> int:
        """One pass: every fact written so far counted (at most BATCH per partition); the facts counted now."""
        pending = await self._store.pending()
        readable = [item for item in pending if item.used is not None]
        taken = Counter(item.partition for item in readable)
        self._more = bool(taken) and max(taken.values()) >= BATCH
        facts = [item.used for item in readable if item.used is not None]
        if not facts:
            return 0
        counted = [used for used, new in zip(facts, await self._store.count(facts), strict=True) if new]
        if self._budgets is not None:
            await self._budgets.counted(counted)
        if self._settle is not None:  # every fact taken, counted here or not: settling an attempt twice charges once
            await self._settle([used for used in facts if used.settles])
        await self._store.clear(readable)
        for used in counted:
            self._observe(used)
        if counted:
            self._log.debug("Counted runs' usage.", extra={"facts": len(counted)})
        return len(counted)

    def _observe(self, used: Used) -> None:
        if used.hermes_ms:
            self._metrics.hermes_seconds.inc(used.hermes_ms / 1000)
        kinds = (("input", used.input_tokens), ("output", used.output_tokens), ("total", used.total_tokens))
        for kind, tokens in kinds:
            if tokens:
                self._metrics.tokens.labels(kind).inc(tokens)

    async def _run(self) -> None:
        while True:
            self._more = False
            try:
                await self.sweep()
            except Exception as error:  # the loop guard: log, and look again next time
                if is_outage(error):
                    self._log.warning("Lost Redis in the usage sweep.", extra={"error": outage_name(error)})
                else:
                    self._log.error("The usage sweep failed.", exc_info=True, extra={"error": repr(error)})
            await asyncio.sleep(0 if self._more else self._every_s)
