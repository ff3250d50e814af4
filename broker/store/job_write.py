"""What one append_events.lua write of a job carries besides its events: its KEYS (all in the job's partition's
slot) and the fields that put a new job in the line (SPEC S4.1, S4.2) and keep the listing's indexes (S3.9)."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from broker.admission import fair
from broker.admission.quotas import Bound
from broker.events import JobStatus
from broker.store import bound as bounds
from broker.store import keys, signals
from broker.store.callbacks import CallbackWrite
from projections.job import JobView


@functools.lru_cache(maxsize=4096)
def write_keys(job_id: str) -> tuple[str, ...]:
    """The KEYS of append_events.lua of the job (all in its partition's slot), for the jobs a replica is
    writing now."""
    due, *shared = partition_write_keys(keys.partition_of(job_id))
    return (keys.events(job_id), keys.view(job_id), keys.lease(job_id), due, keys.board(job_id), *shared)


def entering(
    job_id: str, view: JobView, place: int | None, turn: tuple[str, list[str | int]] | None, *, newcomer: bool
) -> dict[str, object]:
    """The fields of a create's write that put the job in its partition's line (SPEC S4.1, S4.2): the message
    it publishes says whether it started at the virtual time (`newcomer`, on a cluster; on a single Redis the
    write picks one of the two as it takes the turn)."""
    scheduling = view.scheduling
    band = fair.front(scheduling.priority)
    start = place if place is not None else fair.score(scheduling.priority, int(turn[1][1]) if turn else 0)
    at_virtual = signals.newcomer_message(job_id, start, fair.advance(scheduling.fairness_weight))
    joined = {"channel": keys.SIGNALS, "message": at_virtual if newcomer else signals.joined_message(job_id)}
    if turn is not None:
        joined["newcomer"] = at_virtual
    fields: dict[str, object] = {
        "line": "enter",
        "place": str(place if place is not None else band),
        "fair": {"key": scheduling.fairness_key, "weight": repr(scheduling.fairness_weight)},
        "arrived": str(view.created_at_ms),
        "joined": joined,
    }
    if turn is not None:
        key, virtual, step, most = turn[1]
        fields["turn"] = {"key": key, "v": str(virtual), "advance": str(step), "most": str(most), "band": str(band)}
    return fields


@functools.cache
def partition_write_keys(partition: int) -> tuple[str, ...]:
    return (
        keys.due(partition),
        keys.board_outbox(partition),
        keys.board_due(partition),
        keys.board_index(partition),
        keys.line(partition),
        keys.runs(partition),
        keys.scratch(partition),
        keys.fair(partition),
        keys.arrivals(partition),
        *(keys.runs_index(partition, status.value) for status in JobStatus),
        keys.deltas(partition),
    )


def index_entry(partition: int, view: JobView, before: JobView | None, *, created: bool) -> dict[str, str] | None:
    """The listing update of a write (SPEC S3.9), or None when the job's place in it does not change."""
    entry = {"score": str(view.updated_at_ms), "key": keys.runs_index(partition, view.status.value)}
    if created:
        return entry
    if before is None:
        return {**entry, "sweep": "1"}  # the previous status is unknown: leave every other index
    if before.status is view.status and before.updated_at_ms == view.updated_at_ms:
        return None  # e.g. message deltas: nothing a listing orders or filters by changed
    if before.status is not view.status:
        entry["from"] = keys.runs_index(partition, before.status.value)
    return entry


def write_script_keys(
    job_id: str,
    write: dict[str, object],
    turn: tuple[str, list[str | int]] | None,
    callback: CallbackWrite | None,
    bound: tuple[Bound, bounds.Counted] | None,
    usage: Sequence[tuple[int, bytes]],
    *,
    cluster: bool,
) -> list[str]:
    """append_events.lua's KEYS; with the line, the top zset where the key's count is mirrored (SPEC S4.2);
    with owed callbacks, the job's callback hash and its partition's schedule (SPEC S5.8); with a create's
    `bound`, the partitions' counts it checks (SPEC S4.4); with `cost`, the partition's parked jobs and fronts (S4.2
    "What a turn costs"); with usage facts, the partition's zset of them (SPEC S4.5)."""
    script_keys = [*write_keys(job_id), *([turn[0]] if turn else [])]
    if "line" in write:
        script_keys.append(keys.fair_top(keys.partition_of(job_id)))
        write["top"] = str(len(script_keys))
    if callback is not None and callback.add:
        script_keys.extend(callback.script_keys(job_id))
        write["callback"] = callback.fields(len(script_keys) - 1, len(script_keys))
    if bound is not None:
        bounds.add(script_keys, write, *bound, cluster=cluster, job_id=job_id)
    cost = write.get("cost")
    if isinstance(cost, dict):
        partition = keys.partition_of(job_id)
        script_keys.extend((keys.parked(partition), keys.fronts(partition)))
        cost["parked"], cost["fronts"] = str(len(script_keys) - 1), str(len(script_keys))
        turn_cost = cost.get("turn")
        if isinstance(turn_cost, dict):  # a single Redis: the key's cost-aware turn in this write
            turn_cost["first"] = str(len(script_keys) + 1)
            fairness_key, priority = turn_cost["args"][:2]
            script_keys.extend(keys.cost_keys(fairness_key, int(priority)).all)
    if usage:
        script_keys.append(keys.usage_pending(keys.partition_of(job_id)))
        items = [item for when, fact in usage for item in (str(when), fact.decode())]
        write["usage"] = {"key": str(len(script_keys)), "items": items}
    return script_keys
