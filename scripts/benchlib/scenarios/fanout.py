"""TODO"""

from __future__ import annotations

from benchlib.figures import Row
from benchlib.procs import Services
from benchlib.run import Plan


async def run(services: Services, plan: Plan) -> list[Row]:
    return []
