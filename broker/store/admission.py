"""The admission line and slots in Redis (SPEC S4.1): grant, accept, refuse, release, renew (the figures observers
read: broker/store/line_state.py).

The slots and the limit are one cluster-wide set in the `{adm}` slot (Hermes is one resource); the line is
per partition (`hbr:{pN}:line`, entered and left by the job write). A pass (`admit`) is four round trips
however many jobs it grants:
  1. reserves up to n slots in `{adm}` (admission_admit.lua: the limit, probe pacing; a reservation counts
     against the limit but is no live run); none: done (one round trip at the limit);
  2. reads the heads of the lines that may have changed (one pipeline) and merges them by score (SPEC S4.2: the
     score is a job's priority band and start tag; heads that share a score are read whole and ordered by
     arrival, admission_ties.lua, one more round trip only then);
  3. claims the first n heads (admission_claim.lua per head, in one pipeline; each in the job's slot: off
     the line, its run lease taken, due for takeover, its view read); a head another replica took is
     skipped;
  4. with quotas of live runs or tokens (SPEC S4.4), counts the routed jobs' live runs against their keys'
     quotas, or holds them out of the line (quota_take.lua in `{quota}`, one round trip; broker/store/quota.py);
  5. gives the claimed jobs their reserved slots and the unused reservations back (admission_grant.lua, which
     also moves each priority's virtual time V, fair.after_pass; step 1 returns V to the replica).
A crash between steps loses nothing: a reservation expires by itself (RUNS_LEASE), a claimed job is due for
takeover, and a live run counted for a quota expires with its slot. A slot is keyed by its job: the job's run lease
decides who holds it, its expiry (renewed with the lease) returns a dead replica's slots within RUNS_LEASE.

Steps 2 and 3 are broker/store/line_claims.py: a pass reads only the lines that may have changed since this replica
last read them, and every line at most every FULL_READ_MS.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import cast

from attrs import evolve
from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from broker.admission import cost, fair
from broker.admission.cost import CostMode, CostSettings
from broker.admission.known_slots import KnownSlots
from broker.admission.newcomers import Newcomers
from broker.admission.pacing import Pacing
from broker.admission.route import Need, route, take
from broker.admission.state import INITIAL_LIMIT, LineState
from broker.events import HoldReason
from broker.store import keys, signals
from broker.store.affinity import Affinity
from broker.store.batch import ScriptBatch
from broker.store.connection import is_cluster
from broker.store.cost_claims import CostLineClaims
from broker.store.grants import Acceptance, Grant, Grants, Refusal
from broker.store.leases import new_token
from broker.store.line_claims import Claimed, LineClaims
from broker.store.line_state import read_line_state, read_needs, read_virtual
from broker.store.quota import QuotaStore, Taken
from broker.store.replies import ints_and_ids as _ints_and_ids
from broker.store.scripts import Args, Scripts, run_many
from broker.store.upstream_admission import UpstreamSlots, grant_calls, need_of, reserved
from broker.store.upstream_health import HealthStore
from broker.upstreams.health import is_lost
from projections.job import JobView

#: Most jobs a replica remembers as waiting for a busy upstream (SPEC S10), not to claim them while it has no room.
MAX_PARKED = 10_000
#: Most looks at the keys with held jobs in one pass: another when a woken job had finished meanwhile.
WAKE_ROUNDS = 3


class AdmissionStore:
    """The line (one for all upstreams) and the upstreams' admission (SPEC S4.1, S10): `upstreams` in HERMES_URL
    order, each with its own limit and slots; none given (tests), one upstream on today's keys limited to
    `pacing.pinned`."""

    def __init__(
        self,
        redis: Redis,
        pacing: Pacing,
        virtual: fair.VirtualTimes | None = None,
        upstreams: Sequence[UpstreamSlots] = (),
        affinity: Affinity | None = None,
        replica: str = "",
        quota: QuotaStore | None = None,
        cost: tuple[CostSettings, int] | None = None,
    ) -> None:
        """`cost`: ADMISSION_FAIRNESS_COST and RUNS_RETENTION (None or `runs`: the line's fixed tags)."""
        self._redis = redis
        self.quota = quota  #: quotas per fairness key (SPEC S4.4); None: none
        self._replica = replica  #: the lease tokens of its grants name it (SPEC S3.2 `owner`)
        self._scripts = Scripts(redis)
        #: the per-job calls of a loop turn (accepted, release) in one pipeline, as the job writes (single Redis)
        self._batch = None if is_cluster(redis) else ScriptBatch(redis)
        self.pacing = pacing
        self.upstreams = tuple(upstreams) or (UpstreamSlots("", keys.FIRST_ADMISSION, pacing.pinned),)
        self._first = self.upstreams[0].keys
        self._affinity = affinity  #: sessions' upstreams (SPEC S10); None: no affinity
        self.health = HealthStore(redis, self.upstreams)  #: the upstreams' shared health (SPEC S10)
        #: HERMES_UPSTREAM_LOST with several upstreams; 0 with one: a lone upstream is never lost (nowhere to move its
        #: runs, and no replica keeps its health; a streak a fleet left in its state is not read)
        self.lost_ms = pacing.upstream_lost_ms if len(self.upstreams) > 1 else 0
        self.virtual = virtual or fair.VirtualTimes()  #: V per priority, learnt with every pass (SPEC S4.2)
        self.newcomers = Newcomers(len(fair.PRIORITIES))  #: the latest jobs heard to start at V
        self._slots = KnownSlots()  #: the slots this replica granted, and the acceptances it wrote
        #: the lines' heads, claimed (by their keys' costs: broker/store/cost_claims.py)
        self._line = (
            LineClaims(redis, self._scripts, replica, pacing.slot_ttl_ms)
            if cost is None or cost[0].mode is CostMode.RUNS
            else CostLineClaims(redis, self._scripts, replica, pacing.slot_ttl_ms, *cost, self.virtual)
        )
        #: jobs bound to a busy upstream (SPEC S10), left in line by this replica's passes while it has no room
        self._parked: dict[str, str] = {}

    async def admit(self, now_ms: int, most: int) -> Grants:
        """Take up to `most` jobs off the heads of the lines, oldest first, each with a slot and its run
        lease, as far as the limit allows."""
        if self.quota is not None and self.quota.enforced:  # held jobs whose keys have room go back to the line
            await self._return_woken(now_ms)
        full = self._line.full(now_ms)
        if not full and not self._line.any_waiting():
            return Grants([], None)  # no waiting job known here: the next full read looks again
        p, token = self.pacing, new_token()
        replies = await run_many(  # every upstream's own slot (SPEC S10); one script in one round trip for one URL
            self._redis,
            self._scripts.admission_admit,
            [(u.keys.reserving, [now_ms, most, p.slot_ttl_ms, u.pinned, INITIAL_LIMIT, token]) for u in self.upstreams],
        )
        answers = [
            reserved(u, _ints_and_ids(reply), now_ms, self.lost_ms)
            for u, reply in zip(self.upstreams, replies, strict=True)
        ]
        wake = min((a.wake_at_ms for a in answers if a.wake_at_ms), default=0)
        self.virtual.learn(answers[0].virtual, now_ms)
        count = sum(len(a.reservations) for a in answers)
        if not count:
            return Grants([], wake or None)  # at the limits, or pacing refusals: one round trip
        if full:
            self._line.read_all_at(now_ms)
        roomless = {a.upstream.name for a in answers if not a.reservations}
        parked = {job_id for job_id, upstream in self._parked.items() if upstream in roomless}
        taken = await self._line.claim(min(count, most), parked, now_ms, full=full)
        sessions = [v.session_id for *_, v in taken if v is not None and v.attempt == 1 and v.session_id]
        affinities = await self._affinity.of(sessions) if self._affinity is not None and sessions else {}
        grants: list[Grant] = []
        routed: dict[str, list[tuple[str, str]]] = {}
        standings = [a.standing for a in answers]
        for job_id, lease_token, stored, created, place, view in taken:
            need = need_of(view, self.upstreams[0].name, affinities, p.affinity_grace_ms)
            choice = route(standings, need, now_ms)  # SPEC S10: a pure decision
            if choice.upstream is not None:
                standings = take(standings, choice.upstream)
                routed.setdefault(choice.upstream, []).append((job_id, place))
                self._slots.granted(job_id, self.upstream(choice.upstream).name, now_ms)
                self._parked.pop(job_id, None)
            elif need.bound is not None:
                self._park(job_id, need.bound)
            # a job that waits for its busy upstream is driven without a slot: its runner puts it back in line
            grants.append(
                Grant(job_id, lease_token, stored, created, choice.upstream, choice.moved_from, choice.reason, place)
            )
        quota = await self._quotas(taken, routed, now_ms)
        held = quota.held
        if held or quota.waited:
            grants = [
                evolve(g, upstream=None, held=True)
                if g.job_id in held
                else evolve(g, waited_until_ms=now_ms)
                if g.job_id in quota.waited
                else g
                for g in grants
            ]
        # where each started in its priority's virtual time: V moves past these (the grant script too), and a slot
        # given back puts its job there
        started = {
            name: [(job_id, self._line.started(job_id, place)) for job_id, place in jobs]
            for name, jobs in routed.items()
        }
        granted = [float(place) for jobs in started.values() for _, place in jobs]
        room = sum(a.standing.limit for a in answers)
        moved = fair.after_pass(answers[0].virtual, granted, self._waiting, self.newcomers, room)
        self.virtual.lined(cost.lined(granted, self._waiting))
        settle = grant_calls(answers, started, now_ms, p.slot_ttl_ms, moved)
        await run_many(self._redis, self._scripts.admission_grant, settle)
        self.virtual.learn([moved.get(q, v) for q, v in zip(fair.PRIORITIES, answers[0].virtual, strict=True)], now_ms)
        if self._line.drifted:  # rare: jobs moved by an older broker's scripts, which do not count them
            drifted, self._line.drifted = self._line.drifted, []
            costly = isinstance(self._line, CostLineClaims)  # parked jobs are counted as waiting too
            calls: list[tuple[list[str], list[str]]] = [
                ([keys.line(p), keys.fair(p), keys.fair_top(p), *([keys.parked(p)] if costly else [])], [])
                for p in drifted
            ]
            await run_many(self._redis, self._scripts.admission_fair_clear, calls)
        return Grants(grants, wake or None, more=bool(held))

    async def _quotas(self, taken: list[Claimed], routed: dict[str, list[tuple[str, str]]], now_ms: int) -> Taken:
        """Count the routed jobs' live runs against their keys' quotas (SPEC S4.4); those held instead leave `routed`
        (their reserved slots go back) and wait out of the line."""
        if self.quota is None or not self.quota.enforced or not routed:
            return Taken()
        views = {job_id: view for job_id, *_, view in taken if view is not None and not view.status.terminal}
        order = [(job_id, place) for job_id, *_, place, _ in taken]
        chosen = {job_id for jobs in routed.values() for job_id, _ in jobs}
        candidates = [
            (job_id, views[job_id].scheduling.fairness_key, place)
            for job_id, place in order
            if job_id in chosen and job_id in views
        ]
        finished = [
            (job_id, view.scheduling.fairness_key) for job_id, *_, view in taken if view and view.status.terminal
        ]
        await self.quota.forget(finished)  # stopped while woken: claimed, and done
        new = [job_id for job_id, _, _ in candidates if self._line.charged(job_id)]
        decided = await self.quota.take(candidates, now_ms, self.pacing.slot_ttl_ms, new=new)
        for name, jobs in routed.items():
            routed[name] = [(job_id, place) for job_id, place in jobs if job_id not in decided.held]
        for job_id in decided.held:
            self._slots.forget(job_id)
        return decided

    async def lost(self, upstream: str | None, now_ms: int) -> bool:
        """Have calls to the upstream got no answer, at any replica, for HERMES_UPSTREAM_LOST?"""
        return self.lost_ms > 0 and is_lost(await self.health.read(upstream), now_ms, self.lost_ms)

    def _park(self, job_id: str, upstream: str) -> None:
        if len(self._parked) >= MAX_PARKED:
            self._parked.clear()  # a memory bound: at worst those jobs are claimed once more, and parked again
        self._parked[job_id] = upstream

    def _waiting(self, priority: int) -> int | None:
        return self._line.smallest(priority)  # the smallest tag known to wait, after the claims

    def heard(self, job_id: str, newcomer: tuple[int, int] | None = None) -> None:
        """A job is (back) in the line: the next pass reads its partition. `newcomer`: (score, advance) of a job
        that started at V (SPEC S4.2)."""
        self._line.changed(keys.partition_of(job_id))
        found = None if newcomer is None else fair.band_of(newcomer[0])
        if newcomer is not None and found is not None:
            self.newcomers.entered(found[0], found[1], newcomer[1])

    def upstream(self, name: str | None) -> UpstreamSlots:
        """The admission of the upstream named `name`; the first for None or a name not configured (a job an
        older broker accepted names none; SPEC S10 `job.accepted` defaults to the first upstream)."""
        return next((u for u in self.upstreams if u.name == name), self.upstreams[0])

    async def accepted(self, job_id: str, now_ms: int, *, upstream: str | None = None) -> Acceptance:
        p, at = self.pacing, self.upstream(upstream)
        renew = "0" if self._slots.fresh(job_id, at.name, now_ms, p.slot_ttl_ms) else "1"
        reply = await self._run(
            self._scripts.admission_accepted,
            at.keys.scripts,
            [job_id, now_ms, at.pinned, p.quiet_ms, INITIAL_LIMIT, p.slot_ttl_ms, renew],
        )
        self._slots.accepted(job_id)
        limit, grew, ended = (int(x) for x in cast(list[int], reply))
        return Acceptance(limit, grew == 1, ended == 1)

    async def refused(
        self,
        job_id: str,
        now_ms: int,
        *,
        reason: HoldReason,
        detail: str,
        retry_after_ms: int | None,
        jitter: float,
        place: str,
        upstream: str | None = None,
    ) -> Refusal:
        """The job goes back to its place (`place` when its slot no longer knows it); the upstream learns."""
        p, at = self.pacing, self.upstream(upstream)
        self._slots.forget(job_id)
        await self._quota_returned(job_id, place, refused=True)
        reply = await self._scripts.admission_refused(
            keys=at.keys.scripts,
            args=[
                job_id,
                now_ms,
                reason.value,
                detail,
                "" if retry_after_ms is None else retry_after_ms,
                p.backoff_ms,
                p.backoff_max_ms,
                repr(jitter),
                at.pinned,
                "1" if reason is HoldReason.BUSY else "0",
                place,
                INITIAL_LIMIT,
            ],
        )
        retry_at, began, limit, changed, back = _ints_and_ids(reply)
        await self.enter(job_id, back)
        return Refusal(int(retry_at), began == "1", int(limit), changed == "1")

    async def release(self, job_id: str, *, freed: bool, upstream: str | None = None) -> bool:
        """Give the job's slot up; True when this ended a refusal (a settled run freed the slot)."""
        in_flight = "1" if self._slots.in_flight(job_id) else "0"
        await self._quota_released(job_id)
        reply = await self._run(
            self._scripts.admission_release,
            self.upstream(upstream).keys.scripts,
            [job_id, "1" if freed else "0", in_flight],
        )
        return int(cast(list[int], reply)[1]) == 1

    async def _run(self, script: AsyncScript, script_keys: Sequence[str], args: Args) -> object:
        return await (
            script(keys=script_keys, args=args) if self._batch is None else self._batch.run(script, script_keys, args)
        )

    async def _quota_released(self, job_id: str) -> None:
        if self.quota is not None and self.quota.enforced:
            await self.quota.release(job_id)

    async def _quota_returned(self, job_id: str, place: str, *, refused: bool) -> None:
        if self.quota is not None and self.quota.enforced:
            await self.quota.returned(job_id, place, refused=refused)

    async def requeue(self, job_id: str, place: str, *, upstream: str | None = None) -> None:
        self._slots.forget(job_id)
        await self._quota_returned(job_id, place, refused=False)
        back = await self._scripts.admission_requeue(keys=self.upstream(upstream).keys.scripts, args=[job_id, place])
        await self.enter(job_id, back.decode() if isinstance(back, bytes) else str(back))

    async def hold(
        self,
        job_ids: Iterable[str],
        now_ms: int,
        *,
        renew_only: bool = False,
        upstream: str | None = None,
        fairness_key: str | None = None,
    ) -> None:
        """(Re)take the slots of live runs this replica drives on one upstream: renewals (`renew_only`) and
        takeovers (of one job, whose `fairness_key` counts it against its quota)."""
        ttl = self.pacing.slot_ttl_ms
        mapping: dict[str, float] = {job_id: now_ms + ttl for job_id in job_ids}
        if mapping:
            await self._redis.zadd(self.upstream(upstream).keys.live, mapping, xx=renew_only)
        if self.quota is None or not self.quota.enforced:
            return
        if renew_only:
            await self.quota.renew(mapping, now_ms, ttl)
        elif fairness_key is not None:
            for job_id in mapping:
                await self.quota.hold(job_id, fairness_key, now_ms, ttl)

    async def enter(self, job_id: str, place: str) -> None:
        """Make sure a waiting job is in the line (jobs of an older broker, or after a lost write), counted among
        its fairness key's waiting jobs when it was not; every replica hears of it when it was not (`line J`)."""
        self.heard(job_id)
        partition = keys.partition_of(job_id)
        entered = await self._scripts.admission_enter(
            keys=[keys.line(partition), keys.view(job_id), keys.fair(partition), keys.fair_top(partition)],
            args=[job_id, place],
        )
        if int(cast(int, entered)) == 1:  # the other replicas' passes read its line again (as for a create)
            await self._redis.publish(keys.SIGNALS, signals.joined_message(job_id))

    async def _return_woken(self, now_ms: int) -> None:
        """Held jobs whose keys have room again go back to the line (SPEC S4.4), in their order, from the line's
        virtual time on, one turn apart: a key that waited banks no place ahead of the keys that kept the line moving
        (S4.2). One whose job finished or is gone meanwhile is forgotten, and its key looked at again at once."""
        assert self.quota is not None
        for _ in range(WAKE_ROUNDS):
            back = await self.quota.wake(now_ms)
            if not back:
                return
            if self.virtual.stale(now_ms):  # the places go by the line's virtual time: never this replica's stale one
                self.virtual.learn(await read_virtual(self._redis), now_ms)
            turns: dict[str, int] = {}
            calls: list[tuple[Sequence[str], Args]] = []
            for job_id, key, place in back:
                turns[key] = turns.get(key, -1) + 1
                p = keys.partition_of(job_id)
                script_keys = [keys.line(p), keys.view(job_id), keys.fair(p), keys.fair_top(p), keys.lease(job_id)]
                calls.append((script_keys, [job_id, self._returned_place(place, turns[key]), "woken"]))
            replies = [
                int(cast(int, reply)) for reply in await run_many(self._redis, self._scripts.admission_enter, calls)
            ]
            entered = [job_id for (job_id, _, _), reply in zip(back, replies, strict=True) if reply == 1]
            for job_id in entered:  # every replica's pass reads its line again (as for a create), one message
                self.heard(job_id)  # at a time: a cluster client pipelines no PUBLISH
                await self._redis.publish(keys.SIGNALS, signals.joined_message(job_id))
            gone = [(job_id, key) for (job_id, key, _), reply in zip(back, replies, strict=True) if reply == -1]
            if not gone:
                return
            await self.quota.forget(gone)

    def _returned_place(self, place: str, turn: int) -> str:
        """Where a woken job goes back in the line: its own place, or the line's virtual time plus `turn` turns of a
        weight-1 key when that is later (a resubmit keeps its place ahead of every band)."""
        found = fair.band_of(float(place))
        if found is None:
            return place
        priority, tag = found
        return str(fair.score(priority, max(tag, self.virtual.tag(priority) + turn * fair.UNIT)))

    async def needs(self, views: Sequence[JobView]) -> list[Need]:
        """What routing needs of each waiting job (SPEC S10), as a pass would see it (broker/store/line_state.py)."""
        return await read_needs(views, self.upstreams, self._affinity, self.pacing.affinity_grace_ms)

    async def state(self, now_ms: int, *, lines: bool = True) -> LineState:
        """The shared figures (broker/store/line_state.py); without `lines` the 64 lines are not read."""
        return await read_line_state(
            self._redis,
            self.upstreams,
            now_ms,
            self.lost_ms,
            lines=lines,
            figures_script=self._scripts.line_figures,
        )
