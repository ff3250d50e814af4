"""Every driving replica mends the partitions' fair top zsets (broker/store/fair_top.py): a full walk when it
starts (a store an older broker counted in), then a slice of every partition per REPAIR_MS."""

from __future__ import annotations

import asyncio

from broker.logging import get_logger
from broker.store.fair_top import REPAIR_MS, FairTopRepair
from broker.store.outage import is_outage, outage_name
from broker.tasks import cancel_all


class FairTopUpkeep:
    def __init__(self, repair: FairTopRepair) -> None:
        self._repair = repair
        self._task: asyncio.Task[None] | None = None
        self._log = get_logger(FairTopUpkeep)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="fair-top-upkeep")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_all([self._task])
            self._task = None

    async def _run(self) -> None:
        walked = False
        while True:
            try:
                mended = await self._repair.slice() if walked else await self._repair.all()
                walked = True
                if mended:
                    self._log.info("Mended the keys with most waiting jobs.", extra={"mended": mended})
            except Exception as error:  # the loop guard: log, and look again next time
                if is_outage(error):
                    self._log.warning("Lost Redis in the fair top upkeep.", extra={"error": outage_name(error)})
                else:
                    self._log.error("The fair top upkeep failed.", exc_info=True, extra={"error": repr(error)})
            await asyncio.sleep(REPAIR_MS / 1000)
