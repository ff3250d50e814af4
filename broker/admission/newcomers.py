"""The latest jobs that entered the admission line at the virtual time V (SPEC S4.2): jobs of keys without a turn
ahead of V (a new key, or one back from idle). Each create of one says so to every replica, with the tag it started
at and its turn's advance (`new S A J`, broker/store/signals.py); a pass moves V past them by what they cost
(broker/admission/fair.py `moved`), so that the next keys without a turn start behind them.

Kept in memory, per replica, per priority: the latest tag newcomers started at, and how many started there and what
they cost. Every replica hears the same messages, so their passes move V to the same place (V only grows: the
largest wins, never a sum). A message lost only leaves V following the waiting jobs for that job."""

from __future__ import annotations


class Newcomers:
    def __init__(self, priorities: int) -> None:
        self._tag = [-1] * priorities  #: the latest tag newcomers started at (-1: none heard)
        self._count = [0] * priorities  #: how many started there
        self._cost = [0] * priorities  #: their advances summed (tag units)

    def entered(self, priority: int, tag: int, advance: int) -> None:
        """A job of `priority` whose turn costs `advance` entered the line at V = `tag`."""
        index = priority - 1
        if not 0 <= index < len(self._tag) or advance <= 0 or tag < self._tag[index]:
            return  # a create on a replica whose V lagged: behind newcomers already heard
        if tag > self._tag[index]:
            self._tag[index], self._count[index], self._cost[index] = tag, 0, 0
        self._count[index] += 1
        self._cost[index] += advance

    def past(self, priority: int, room: int) -> int | None:
        """Where V must be for the next newcomers to start behind those heard: their tag plus what they cost, of at
        most `room` of them (the runs the line may have live: newcomers arriving about as fast as slots free up;
        those beyond arrived together with them and share their turn, so a burst leaves no debt). None: none
        heard."""
        index = priority - 1
        count = self._count[index]
        if not count:
            return None
        return self._tag[index] + self._cost[index] * min(count, max(1, room)) // count
