"""Whether Redis has room for new jobs (SPEC S4.4). Pure: the nodes' memory readings in, a verdict out."""

from __future__ import annotations

from collections.abc import Iterable

from broker.store.memory import NodeMemory


def past_mark(readings: Iterable[NodeMemory], high: float) -> NodeMemory | None:
    """The node whose used memory is furthest past `high` of its maxmemory, or None when every node is below its
    mark. A node without a maxmemory (0) has no mark: Redis then never refuses a write for memory."""
    over = [node for node in readings if node.maxmemory > 0 and node.used > high * node.maxmemory]
    return max(over, key=lambda node: node.used / node.maxmemory, default=None)
