"""The simulator's own words for Hermes's wire: JSON objects and run statuses, from hermes-runs-api.md.

Deliberately not imported from broker.hermes (STYLE C.3): the contract suite runs the broker's Hermes client
against this stand-in, so a constant shared by both would be wrong in both and no test would notice.
"""

from __future__ import annotations

from typing import TypeAlias

JsonObject: TypeAlias = dict[str, object]

#: Statuses a run never leaves: Hermes 0.19.0 ends runs `completed`, `failed` or `cancelled`; upstream main also
#: reports `interrupted` for a keyed run whose process restarted before it settled.
TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled", "interrupted"})
