"""Steps 2 and 3 of an admission pass when `ADMISSION_FAIRNESS_COST` is `time` or `tokens` (SPEC S4.2 "What a turn
costs"; design 4): each round reads the lines that may have changed with their parked jobs and fronts entries
(line_heads.lua, one pipeline), plans up to the room over the merged heads (cost.considered, cost.plan: a front, then
its key's next jobs at its estimate apart, merged with the other keys'), claims the planned jobs (admission_claim.lua
from the line or the parked jobs, one pipeline), runs the key step of each key whose first attempts it claimed
(fair_next.lua, one pipeline: each charged its estimate, once per attempt) and places the keys' next fronts
(fair_promote.lua, one pipeline; a front found gone is reported `left` and its key's next one placed). A round
plans a key's jobs only as far as its fronts entry names them; the next round reads the new fronts (CLAIM_ROUNDS at
most; the last also takes parked jobs behind fronts it could not plan: nothing idles for fairness).

Resubmits and jobs an older broker placed are single heads ahead of the bands, granted first and stepped by nobody
(a resubmit is charged what it measured, at its settle).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import cast

from redis.asyncio import Redis

from broker.admission import cost, fair
from broker.admission.cost import CostSettings
from broker.admission.heads import DEPTH
from broker.codec import decode_view
from broker.store import keys
from broker.store.cost_store import CostStore, Entry, Front, Step
from broker.store.leases import new_token
from broker.store.line_claims import CLAIM_ROUNDS, DRIFT_CHECK_MS, Claimed, LineClaims, claimed_of
from broker.store.replies import text
from broker.store.scripts import Scripts, run_many

#: Fronts found gone in a row one key's placing follows (each reported `left`); the rest wait for the next step.
GONE_ROUNDS = 3

Planned = tuple[str, int]  #: a job a round plans to claim, and its partition
Parked = tuple[tuple[str, float], ...]  #: a partition's first parked jobs, (job, score), as read
Ordered = list[tuple[cost.Rank, float, str, int]]  #: parked heads as (rank, arrival, job, partition), in merge order


class CostLineClaims(LineClaims):
    """LineClaims whose rounds plan by the keys' costs."""

    def __init__(
        self,
        redis: Redis,
        scripts: Scripts,
        replica: str,
        ttl_ms: int,
        settings: CostSettings,
        retention_ms: int,
        virtual: fair.VirtualTimes,
    ) -> None:
        super().__init__(redis, scripts, replica, ttl_ms)
        self.costs = CostStore(redis, settings, retention_ms, scripts)
        self._virtual = virtual  #: V per priority as the pass learnt it (the key steps' V)
        self._parked_heads: dict[int, Parked] = {}  #: partition -> its first parked jobs
        #: partition -> (its parked heads, them in merge order), as last sorted
        self._parked_sorted: dict[int, tuple[Parked, Ordered]] = {}
        self._entries: dict[str, Entry] = {}  #: front -> its fronts entry, as last read
        #: partition -> job read -> its created ms (heads of one rank go oldest first)
        self._arrived: dict[int, dict[str, float]] = {}
        #: job claimed -> the score its key step charged it from: V moves past these (a parked job's place is only
        #: its projection at create, by the estimate then)
        self.begins: dict[str, int] = {}
        self._placed: dict[str, int] = {}  #: front -> its score, of the fronts the latest claim placed

    def any_waiting(self) -> bool:
        return super().any_waiting() or any(self._parked_heads.values())

    def smallest(self, priority: int) -> int | None:
        """The smallest tag of `priority` known to wait here, the fronts the latest claim placed among them (its
        lines are read again only by the next pass: without them V would move to a later key's front)."""
        return fair.smallest([*self._known.scores(), *self._placed.values()], priority)

    def charged(self, job_id: str) -> bool:
        """Was the job charged its key's turn by the latest claim (its key's next job, whose place a settle's
        correction may have put before its key's earlier jobs)? A job granted again in its attempt is not."""
        return job_id in self.begins

    def started(self, job_id: str, place: str) -> str:
        """The score of the tag its key step charged it from (a parked job's place is its projection at create, by
        the estimates then); a job no step charged (a resubmit, a second charge) keeps its place."""
        begin = self.begins.get(job_id)
        return place if begin is None else str(begin)

    async def claim(self, most: int, parked: set[str], now_ms: int, *, full: bool) -> list[Claimed]:
        taken: list[Claimed] = []
        self.begins, self._placed = {}, {}
        tried: set[str] = set()
        for attempt in range(CLAIM_ROUNDS):
            wanted = most - len(taken)
            if wanted <= 0:
                break
            skipped = parked | tried
            await self._read(wanted + len(skipped), now_ms, full=full and attempt == 0)
            planned = self._plan(wanted, skipped, fallback=attempt == CLAIM_ROUNDS - 1)
            if not planned:
                if attempt < CLAIM_ROUNDS - 1 and any(self._parked_heads.values()):
                    continue  # parked jobs behind fronts not plannable here: the last round takes them
                break
            tried.update(job_id for job_id, _ in planned)
            taken.extend(await self._claim_round(planned, now_ms))
        return taken

    async def _read(self, most: int, now_ms: int, *, full: bool) -> None:
        """Read the lines that may have changed (every line when `full`) with their parked jobs and fronts entries."""
        read = list(keys.partitions()) if full else self._known.to_read(most)
        if not read:
            return
        depth = max(most, DEPTH)
        self._known.reading(read)
        found = await self.costs.heads(read, depth, arrived=True)
        fresh = set(read)
        self._entries = {job: e for job, e in self._entries.items() if keys.partition_of(job) not in fresh}
        for partition, heads in found.items():
            self._known.read(partition, list(heads.line), depth)
            self._parked_heads[partition] = heads.parked
            self._entries.update(heads.fronts)
            self._arrived[partition] = dict(heads.arrived)
        if full and now_ms - self._drift_checked_at >= DRIFT_CHECK_MS:
            self._drift_checked_at = now_ms
            await self._check_drift([p for p, heads in found.items() if not heads.line and not heads.parked])
            if await self._repair([heads.parked[0][0] for heads in found.values() if heads.parked]):
                await self._read(most, now_ms, full=False)  # the fronts placed: their lines again

    async def _repair(self, parked: Sequence[str]) -> bool:
        """The keys of the first parked job of each partition get their fronts placed again (as a key step does): a
        key whose front is in no line (a create that died after taking its turn, a replica that died between its
        claims and the key steps, a stop whose key step failed) would otherwise wait for a pass's last round. A
        front found gone is reported `left`, its key's next job placed. Looked at with the drift (every
        DRIFT_CHECK_MS): a front claimed a moment ago by a replica about to step its key may be reported `left` too
        (its key's next job then starts at the same tag). True: some front was placed."""
        if not parked:
            return False
        async with self._redis.pipeline(transaction=False) as pipe:
            for job_id in parked:
                pipe.hget(keys.view(job_id), "state")
            states = await pipe.execute()
        weights: dict[tuple[str, int], float] = {}
        for state in states:
            view = decode_view(text(state)) if state else None
            if view is not None:
                s = view.scheduling
                weights[(s.fairness_key, s.priority)] = s.fairness_weight
        lines = await self.costs.key_lines(list(weights))
        fronts = [Front(key, priority, line.placed) for (key, priority), line in lines.items() if line.placed]
        async with self._redis.pipeline(transaction=False) as pipe:  # a front in its line keeps its entry as it is
            for front in fronts:
                pipe.zscore(keys.line(keys.partition_of(front.placed.job)), front.placed.job)
            found = await pipe.execute()
        astray = [front for front, place in zip(fronts, found, strict=True) if place is None]
        return await self.place(astray, weights) > 0

    def _plan(self, most: int, skipped: set[str], *, fallback: bool) -> list[Planned]:
        """The jobs a round claims, in line order (cost.plan over the known heads: the fronts, and as many of the
        parked jobs, in their merged order, as a plan of `most` can reach; a backlog's parked jobs are many)."""
        heads: list[cost.Head] = []
        where: dict[str, int] = {}
        for partition, line in self._known.lines():
            for job_id, score in line:
                if job_id in skipped:
                    continue
                entry = self._entries.get(job_id)
                advance, more = (entry.advance, min(entry.more, len(entry.next))) if entry else (0, 0)
                arrival = self._arrived.get(partition, {}).get(job_id, 0.0)
                heads.append(cost.Head(cost.rank(score, parked=False), job_id, arrival, advance, more))
                where[job_id] = partition
        # a parked job may be read both as a parked head and as the next of its key's front: planned once
        nexts = {job for entry in self._entries.values() for job in entry.next}
        parked: list[cost.Head] = []
        reach = most + len(nexts)
        for rank, arrival, job_id, partition in heapq.merge(*(self._parked_order(p) for p in self._parked_heads)):
            if len(parked) >= reach:
                break
            if job_id not in skipped:
                parked.append(cost.Head(rank, job_id, arrival))
                where[job_id] = partition
        heads.extend(parked)
        heads.sort(key=lambda head: (head.rank, head.arrival))
        planned: list[Planned] = []
        chosen: set[str] = set()
        twice = sum(1 for head in parked if head.job in nexts)
        for head, n in cost.plan(cost.considered(heads, fallback=fallback), most + len(skipped) + twice):
            job_id = head.job if n == 0 else self._entries[head.job].next[n - 1]
            if job_id not in skipped and job_id not in chosen and len(planned) < most:
                chosen.add(job_id)
                planned.append((job_id, where[head.job] if n == 0 else keys.partition_of(job_id)))
        return planned

    async def _claim_round(self, planned: Sequence[Planned], now_ms: int) -> list[Claimed]:
        """Claim the planned jobs; step the keys of the first attempts claimed and place their next fronts."""
        heads = [(job_id, new_token(self._replica), partition) for job_id, partition in planned]
        read = {job_id: self._entries[job_id] for job_id, _ in planned if job_id in self._entries}
        claims = await run_many(self._redis, self._scripts.admission_claim, self._cost_claim_calls(heads, now_ms))
        taken: list[Claimed] = []
        for (job_id, lease_token, partition), claim in zip(heads, claims, strict=True):
            reply = cast(list[object], claim)
            self._placed.pop(job_id, None)  # claimed, or gone: no longer waiting
            if reply[0] == 1:
                taken.append(claimed_of(job_id, lease_token, reply))
                self._known.taken(job_id, partition, gone=False)
                self._forget_parked(job_id, partition)
            elif reply[0] == 0:  # gone: another replica took it, or it was stopped
                self._known.taken(job_id, partition, gone=True)
                self._forget_parked(job_id, partition)
        await self._step(taken, read)
        return taken

    def _cost_claim_calls(
        self, heads: Sequence[tuple[str, str, int]], now_ms: int
    ) -> list[tuple[list[str], list[str | int]]]:
        calls = self._claim_calls(heads, now_ms)
        for (script_keys, _), (_, _, partition) in zip(calls, heads, strict=True):
            script_keys.extend((keys.parked(partition), keys.fronts(partition)))
        return calls

    def _parked_order(self, partition: int) -> Ordered:
        """The partition's parked heads as (rank, arrival, job, partition), in merge order: sorted once per read or
        claim of the partition, not per round."""
        parked = self._parked_heads[partition]
        cached = self._parked_sorted.get(partition)
        if cached is not None and cached[0] is parked:
            return cached[1]
        arrived = self._arrived.get(partition, {})
        order = sorted(
            (cost.rank(score, parked=True), arrived.get(job_id, 0.0), job_id, partition) for job_id, score in parked
        )
        self._parked_sorted[partition] = (parked, order)
        return order

    def _forget_parked(self, job_id: str, partition: int) -> None:
        parked = self._parked_heads.get(partition)
        if parked:
            self._parked_heads[partition] = tuple(entry for entry in parked if entry[0] != job_id)
        self._entries.pop(job_id, None)
        self._arrived.get(partition, {}).pop(job_id, None)

    async def _step(self, taken: Sequence[Claimed], read: dict[str, Entry]) -> None:
        """The key steps of the claimed first attempts, in claim order per key, and their keys' next fronts placed
        (by the step itself when it is the one the fronts entries `read` of the claimed jobs make expected)."""
        by_key: dict[tuple[str, int], tuple[float, list[Step]]] = {}
        for job_id, _, _, _, place, view in taken:
            if view is None or view.attempt != 1 or fair.band_of(float(place)) is None:
                continue  # a resubmit, or a job an older broker placed: no key step
            s = view.scheduling
            by_key.setdefault((s.fairness_key, s.priority), (s.fairness_weight, []))[1].append(Step(job_id))
        if not by_key:
            return
        calls = [
            (key, priority, weight, self._virtual.tag(priority), jobs)
            for (key, priority), (weight, jobs) in by_key.items()
        ]
        steps = await self.costs.steps(calls, [_expected(jobs, read) for *_, jobs in calls])
        for (_, priority, _, _, _), step in zip(calls, steps, strict=True):
            self.begins.update((job_id, fair.score(priority, tag)) for job_id, tag in step.begins)
        weights = {(key, priority): weight for key, priority, weight, _, _ in calls}
        fronts = [(step.front, step.placed) for step in steps if step.front is not None]
        await self.place([front for front, _ in fronts], weights, [placed for _, placed in fronts])

    async def place(
        self,
        fronts: Sequence[Front],
        weights: dict[tuple[str, int], float],
        answers: Sequence[int | None] = (),
    ) -> int:
        """Place the keys' fronts in their lines; one found gone is reported `left`, its key's next one placed.
        `answers`: per front, fair_promote's answer when its key step placed it already (None: not). The fronts that
        joined a line (not there already)."""
        joined = 0
        for _ in range(GONE_ROUNDS):
            if not fronts:
                return joined
            for front in fronts:
                self._known.changed(keys.partition_of(front.placed.job))
            placed = await self._promote(fronts, answers)
            answers = ()
            joined += sum(1 for answer in placed if answer == 1)
            self._placed.update((f.placed.job, f.score) for f, answer in zip(fronts, placed, strict=True) if answer)
            gone = [front for front, answer in zip(fronts, placed, strict=True) if answer == 0]
            if not gone:
                return joined
            calls = [
                (
                    f.key,
                    f.priority,
                    weights.get((f.key, f.priority), 1.0),
                    self._virtual.tag(f.priority),
                    [Step(f.placed.job, left=True)],
                )
                for f in gone
            ]
            fronts = [step.front for step in await self.costs.steps(calls) if step.front is not None]
        return joined

    async def _promote(self, fronts: Sequence[Front], answers: Sequence[int | None]) -> list[int]:
        """fair_promote's answer for each front: as given, or from placing those without one (one pipeline)."""
        given = list(answers) or [None] * len(fronts)
        if all(answer is not None for answer in given):
            return [answer for answer in given if answer is not None]
        rest = iter(await self.costs.promote([f for f, answer in zip(fronts, given, strict=True) if answer is None]))
        return [next(rest) if answer is None else answer for answer in given]


def _expected(jobs: Sequence[Step], read: dict[str, Entry]) -> str | None:
    """The front a key step of the claimed `jobs` leaves, as their fronts entries read show it: the first job named
    behind a claimed front that was not claimed (None: unknown, or none waits)."""
    claimed = {step.job for step in jobs}
    for step in jobs:
        entry = read.get(step.job)
        if entry is not None:
            return next((job for job in entry.next if job not in claimed), None)
    return None
