"""The jobs that entered the admission line at the virtual time V since this replica's last pass (SPEC S4.2): jobs of
keys without a turn ahead of V (a new key, or one back from idle). Each create of one says so to every replica
(`new P A J`, broker/store/signals.py); a pass pushes V on by what they cost, so that the next keys without a turn
start behind them (broker/admission/fair.py `moved`).

Kept in memory, per replica, per priority. When a pass finds V moved by another replica since this one last set or
learnt it, the newcomers heard before are taken as counted there. A message lost only makes V follow the waiting
jobs alone for that job."""

from __future__ import annotations

from collections.abc import Sequence


class Newcomers:
    def __init__(self, priorities: int) -> None:
        self._count = [0] * priorities  #: newcomers heard per priority since the last pass took them
        self._cost = [0] * priorities  #: their advances summed (tag units)
        self._known = [0] * priorities  #: V per priority as this replica last set or learnt it

    def entered(self, priority: int, advance: int) -> None:
        """A job of `priority` whose turn costs `advance` entered the line at V."""
        if 1 <= priority <= len(self._count) and advance > 0:
            self._count[priority - 1] += 1
            self._cost[priority - 1] += advance

    def learnt(self, tags: Sequence[int]) -> None:
        """V per priority as a pass read it: moved by another replica, it counted the newcomers heard until then."""
        for index, tag in enumerate(tags[: len(self._known)]):
            if tag > self._known[index]:
                self._count[index] = self._cost[index] = 0
                self._known[index] = tag

    def push(self, priority: int, granted: int, room: int) -> int:
        """How far a pass that granted `granted` first attempts of `priority` pushes its V: the cost of as many of
        the newcomers heard as it granted. Of the rest, up to `room` (the runs the line may have live: newcomers
        arriving about as fast as slots free up) wait for the next passes; those beyond arrived together with them
        and share their tag, so they push nothing."""
        index = priority - 1
        count, cost = self._count[index], self._cost[index]
        if not count or granted <= 0:
            return 0
        used = min(count, granted)
        pushed = cost * used // count
        left = min(count - used, max(0, room))
        self._count[index], self._cost[index] = left, (cost - pushed) * left // max(1, count - used)
        return pushed

    def set(self, priority: int, tag: int) -> None:
        """This replica's pass moved V of `priority` to `tag`."""
        self._known[priority - 1] = max(self._known[priority - 1], tag)
