"""What the cost scripts must compute, from broker/admission/cost.py alone (the tests' reference for
broker/store/cost_store.py): per (priority, key) its KeyLine, per key its History, per job the charge of its run in
flight, and the attempts settled. Pure; no IO."""

from __future__ import annotations

from collections.abc import Sequence

from attrs import define, evolve, field

from broker.admission import cost
from broker.admission.cost import Charge, CostMode, CostSettings, History, KeyLine, Placed
from broker.store.cost_store import NEXT, Step


@define
class Reference:
    settings: CostSettings
    lines: dict[tuple[int, str], KeyLine] = field(factory=dict)
    history: dict[str, History] = field(factory=dict)
    charges: dict[str, Charge] = field(factory=dict)
    settled: set[tuple[str, int]] = field(factory=set)

    def _floor(self, key: str, priority: int) -> int:
        return cost.after(c.start for c in self.charges.values() if (c.key, c.priority) == (key, priority))

    def _advance(self, key: str, weight: float) -> int:
        return cost.estimate(self.history.get(key, History()), self.settings, weight)

    def enter(self, job: str, key: str, priority: int, weight: float, virtual: int, paced: int) -> Placed:
        line = self.lines.get((priority, key), KeyLine())
        line, placed = cost.enter(line, job, virtual, self._advance(key, weight), paced)
        self.lines[(priority, key)] = line
        return placed

    def step(self, key: str, priority: int, weight: float, virtual: int, jobs: Sequence[Step]) -> int:
        """fair_next.lua's work: (how many jobs it charged)."""
        advance, charged = self._advance(key, weight), 0
        for step in jobs:
            if step.left:
                line = self.lines.get((priority, key), KeyLine())
                self.lines[(priority, key)] = cost.left(line, step.job, advance)[0]
            else:
                guessed = self.settings.mode is not CostMode.RUNS and not self.history.get(key, History()).runs
                charged += self._granted(step.job, step.attempt, key, priority, weight, virtual, advance, guessed)
        return charged

    def _granted(
        self,
        job: str,
        attempt: int,
        key: str,
        priority: int,
        weight: float,
        virtual: int,
        advance: int,
        guessed: bool = False,
    ) -> int:
        line = self.lines.get((priority, key), KeyLine())
        paid = job in self.charges or (job, attempt) in self.settled
        scheduling = (key, priority, weight)
        floor = self._floor(key, priority)
        line, charge, _ = cost.granted(
            line, job, scheduling, virtual, advance, charged=paid, guessed=guessed, floor=floor
        )
        self.lines[(priority, key)] = line
        if charge is not None:
            self.charges[job] = charge
        return 0 if charge is None else 1

    def settle(
        self, job: str, attempt: int, key: str, priority: int, weight: float, measured: float | None, virtual: int
    ) -> tuple[bool, int, Charge | None, int | None]:
        """fair_settle.lua's work: (applied, delta, the charge settled, the measured units)."""
        if (job, attempt) in self.settled:
            return False, 0, None, None
        units = None if measured is None else cost.charge(measured, weight)
        if job not in self.charges:  # the grant's key step never ran: done now, charging what the run measured
            advance = self._advance(key, weight) if units is None else units
            self._granted(job, attempt, key, priority, weight, virtual, advance)
        charge = self.charges.pop(job)
        if measured is not None:
            self.history[key] = self.history.get(key, History()).settled(measured)
        advance = self._advance(key, weight)
        line, delta = cost.settled(self.lines.get((priority, key), KeyLine()), charge, units, virtual, advance)
        line, _ = cost.retagged(line, advance, self._floor(key, priority))  # the front moves to the corrected F
        self.lines[(priority, key)] = line
        self.settled.add((job, attempt))
        return True, delta, charge, units

    def line(self, priority: int, key: str, virtual: int) -> KeyLine:
        """The key's state as the store keeps it: an idle key is its F alone, and only while it is ahead of V."""
        return normal(self.lines.get((priority, key), KeyLine()), virtual)

    def front(self, priority: int, key: str) -> tuple[Placed | None, int, tuple[str, ...]]:
        """The key's front, how many wait behind it and the first NEXT of them."""
        line = self.lines.get((priority, key), KeyLine())
        if line.front is None:
            return None, 0, ()
        more = len(line.queue) - 1 if line.queue and line.queue[0] == line.front else 0
        return line.placed, more, line.queue[1 : 1 + min(more, NEXT)]


def normal(line: KeyLine, virtual: int) -> KeyLine:
    if line.queue:
        return line
    finish = line.finish if line.finish is not None and line.finish > virtual else None
    return evolve(KeyLine(), finish=finish)
