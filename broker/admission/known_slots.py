"""What a replica knows of the admission slots it wrote (SPEC S4.1), so that its next writes skip what is so already:
a slot it granted within half a slot's ttl is live and unexpired when Hermes accepts the create (no renewal needed:
the renewals of live runs follow), and a job whose acceptance it wrote has no create in flight when its slot is
released. Memory only: a job it does not know (taken over, forgotten) gets every write."""

from __future__ import annotations

#: Jobs remembered at most (a memory bound: past it, all are forgotten, and get every write).
MOST = 10_000


class KnownSlots:
    def __init__(self) -> None:
        self._granted: dict[str, tuple[str, int]] = {}  #: job -> (upstream, when this replica granted its slot)
        self._accepted: set[str] = set()  #: jobs whose acceptance this replica wrote (not in the slots hash)

    def granted(self, job_id: str, upstream: str, now_ms: int) -> None:
        if len(self._granted) >= MOST:
            self._granted.clear()
        self._granted[job_id] = (upstream, now_ms)
        self._accepted.discard(job_id)

    def fresh(self, job_id: str, upstream: str, now_ms: int, ttl_ms: int) -> bool:
        """Was the job's slot on `upstream` granted here less than half its ttl ago? (Forgets the grant.)"""
        grant = self._granted.pop(job_id, None)
        return grant is not None and grant[0] == upstream and 0 <= now_ms - grant[1] < ttl_ms // 2

    def accepted(self, job_id: str) -> None:
        if len(self._accepted) >= MOST:
            self._accepted.clear()
        self._accepted.add(job_id)

    def in_flight(self, job_id: str) -> bool:
        """May the job's create be in flight (its place in the slots hash)? (Forgets the job.)"""
        self._granted.pop(job_id, None)
        if job_id in self._accepted:
            self._accepted.discard(job_id)
            return False
        return True

    def forget(self, job_id: str) -> None:
        self._granted.pop(job_id, None)
        self._accepted.discard(job_id)
