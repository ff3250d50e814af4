"""What a replica knows of the partition lines between two reads (SPEC S4.1), so that a pass reads only the lines
that may have changed: the first jobs of each line as last read (a prefix of it, in line order), which lines
hold more than that prefix, and which changed since (a job joined: a `line J` message, or this replica put one
back; a head this replica tried to claim was gone: another replica took it, or it was stopped).

Every read of a line replaces what is known of it; a pass claims what it merges from the known prefixes, and the
claim script checks each job is still in its line. Kept in memory, per replica: a change no message names (an older
replica's requeue) is seen by the next read of every line (broker/store/admission.py FULL_READ_MS)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator

from broker.admission.fair import Head

#: Jobs read from a line at least, so that a pass that takes a few leaves the next pass some to merge unread.
DEPTH = 16


class KnownHeads:
    def __init__(self) -> None:
        self._lines: dict[int, list[tuple[str, float]]] = {}  #: partition -> its first jobs (job, score), in order
        self._deep: set[int] = set()  #: lines that held more than was read
        self._changed: set[int] = set()  #: lines that changed since their last read (or were never read)

    def any_waiting(self) -> bool:
        """May a job wait in a line this replica knows of (without a read of every line)?"""
        return bool(self._changed or self._deep or any(self._lines.values()))

    def changed(self, partition: int) -> None:
        """A job joined the line of `partition` (or one left that this replica did not take): read it again."""
        self._changed.add(partition)

    def to_read(self, most: int) -> list[int]:
        """The lines a pass that needs `most` heads must read: changed ones, and those whose known prefix is shorter
        than `most` while the line holds more."""
        return sorted(self._changed | {p for p in self._deep if len(self._lines.get(p, ())) < most})

    def reading(self, partitions: Iterable[int]) -> None:
        """A read of these lines begins: a change heard while it is on its way may be newer, and stays."""
        self._changed.difference_update(partitions)

    def read(self, partition: int, line: list[tuple[str, float]], depth: int) -> None:
        """What a read of `depth` jobs of the line found."""
        self._lines[partition] = line
        if len(line) >= depth:
            self._deep.add(partition)
        else:
            self._deep.discard(partition)

    def merged(self, most: int) -> list[Head]:
        """The first `most` + 1 known heads over every line, in line order (score, then job id), and those after them
        of the last one's score (a tie at the cut is ordered by arrival: fair.tied_at_cut). The lines are merged
        lazily: a pass over 64 lines of 16 known heads builds only the heads it looks at."""
        heads: list[Head] = []
        for head in heapq.merge(*(_heads(partition, line) for partition, line in self._lines.items() if line)):
            if len(heads) > most and head[0] != heads[-1][0]:
                break
            heads.append(head)
        return heads

    def lines(self) -> Iterator[tuple[int, list[tuple[str, float]]]]:
        """Each line's known heads (partition, its first jobs in order)."""
        return iter(self._lines.items())

    def scores(self) -> Iterator[float]:
        """The scores of every known job."""
        return (score for line in self._lines.values() for _, score in line)

    def taken(self, job_id: str, partition: int, *, gone: bool) -> None:
        """This replica claimed the job off its line; `gone`: it was not in the line any more (read the line again)."""
        line = self._lines.get(partition)
        if line is not None:
            self._lines[partition] = [entry for entry in line if entry[0] != job_id]
        if gone:
            self._changed.add(partition)


def _heads(partition: int, line: list[tuple[str, float]]) -> Iterator[Head]:
    """A line's known heads, in its order (a line is read in score order, then job id)."""
    for job_id, score in line:
        yield score, job_id, partition
