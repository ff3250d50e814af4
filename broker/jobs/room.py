"""Whether Redis has room for another job (SPEC S4.4). Pure: the nodes' memory readings in, a verdict out.

A job accepted now still writes after it: its run's events, its settling, its end. So each node keeps, below
REDIS_MEMORY_HIGH of its maxmemory, what it holds plus a reserve for every job on it that has not ended, plus
what this replica has written since the reading.
"""

from __future__ import annotations

from collections.abc import Iterable

from attrs import frozen

from broker.store.memory import NodeMemory

#: What a new job costs beside its execution body: its stream, view and schedule entries (the memory
#: figures of docs/benchmarks.md: 2.6 KB per queued job of a 724-byte create).
JOB_BYTES = 2_048
#: What a job that has not ended may still write: a run of about 20 events (docs/benchmarks.md: 7.1 KB per
#: finished job of 20 events against 2.6 KB queued). Runs that relay thousands of deltas need more: REDIS_MEMORY_HIGH
#: is the operator's margin for those.
RESERVE_BYTES = 4_096
#: Refusing ends only once a reading finds every node this far below its mark (as a share of it), so a flood that
#: keeps Redis at the mark turns the refusal on and off every few seconds, not at every reading.
HYSTERESIS = 0.98


@frozen
class Since:
    """What this replica added after the reading: bytes written and jobs created."""

    bytes: int = 0
    jobs: int = 0

    def plus(self, body_bytes: int) -> Since:
        return Since(self.bytes + body_bytes + JOB_BYTES, self.jobs + 1)


def need(node: NodeMemory, since: Since) -> int:
    """What the node holds and owes: used memory, the replica's writes since the reading, the reserve of its
    unfinished jobs. A replica does not know which node its next jobs land on: it counts them on every node."""
    return node.used + since.bytes + (node.unfinished + since.jobs) * RESERVE_BYTES


NOTHING = Since()


def past_mark(readings: Iterable[NodeMemory], high: float, since: Since = NOTHING) -> NodeMemory | None:
    """The node whose need is furthest past `high` of its maxmemory, or None when every node is below its mark.
    A node without a maxmemory (0) has no mark: Redis then never refuses a write for memory."""
    over = [node for node in readings if node.maxmemory > 0 and need(node, since) > high * node.maxmemory]
    return max(over, key=lambda node: need(node, since) / node.maxmemory, default=None)


def headroom(readings: Iterable[NodeMemory], high: float) -> float | None:
    """What a replica may still add after the reading (bytes, with RESERVE_BYTES per job) before a node passes its
    mark: the least over the nodes with a mark; None when no node has one (nothing is ever refused)."""
    rooms = [high * node.maxmemory - need(node, NOTHING) for node in readings if node.maxmemory > 0]
    return min(rooms, default=None)


def cost(since: Since) -> int:
    """What `since` adds to every node's need (`need` is the reading's need plus this)."""
    return since.bytes + since.jobs * RESERVE_BYTES
