"""A drain's hand-back of the jobs its runners drove (SPEC S4 "Drain"): each job's lease released for immediate
takeover, with its admission slot where it belongs; a job whose create was on its way once Hermes's answer is
recorded (within the drain's budget), so that its next owner follows that run instead of creating a second one
(Hermes 0.19 ignores the create's Idempotency-Key). And a runner's hand-back after a failure: the slot of a job
that was taken over meanwhile left to its new owner, a lost runner's ended job's slot and session let go."""

from __future__ import annotations

import contextlib

from broker.admission.state import line_place
from broker.driver.deps import Deps, Ending
from broker.driver.runner import Runner
from broker.logging import get_logger
from broker.store.outage import REDIS_FAILURES, is_outage, log_failure


async def hand_back(deps: Deps, runners: list[Runner]) -> int:
    """Hand the drained runners' jobs back for immediate takeover; how many were."""
    now, handed = deps.clock.now_ms(), 0
    for runner in runners:
        with contextlib.suppress(*REDIS_FAILURES):
            await _slot_back(deps, runner, now)
            handed += await deps.leases.release(runner.job_id, runner.token, due_at_ms=now, enqueue=True)
    return handed


async def when_answered(deps: Deps, runner: Runner, wait_s: float) -> tuple[int, bool]:
    """A job whose create was on its way: Hermes's answer is waited for (at most `wait_s`) and an accepted run
    recorded; then the job is handed back, at once (not after the other jobs' answers). (Handed back, recorded.)"""
    recorded = False
    try:
        recorded = await runner.record_unrecorded(wait_s)
    except Exception as error:
        log_failure(
            get_logger(__name__),
            error,
            outage="Lost Redis recording a run on shutdown.",
            bug="Could not record a run on shutdown.",
            job=runner.job_id,
        )
    return await hand_back(deps, [runner]), recorded


async def _slot_back(deps: Deps, runner: Runner, now_ms: int) -> None:
    """A drained runner's slot: one whose create never went (or was refused) goes back with the job to its place, one
    of a job that ended (stopped while the drain waited for its create) is released; one of a live run is the next
    owner's to take over."""
    view, gate = runner.view, deps.gate
    if not runner.has_slot or view is None or (runner.ran and not view.status.terminal):
        return
    if not await deps.leases.renew(runner.job_id, runner.token, now_ms):
        return  # taken over while the drain waited for Hermes: its slot and place are the new owner's
    if view.status.terminal:
        await gate.release(runner.job_id, freed=runner.ran, upstream=runner.slot_upstream)
    else:
        await gate.requeue(runner.job_id, line_place(view), upstream=runner.slot_upstream)


async def let_go_if_ended(deps: Deps, runner: Runner) -> None:
    """A lease found gone from a job that has ended: its own ending write ran but was answered `FENCED` (its reply
    lost, the call sent again found the lease that write released), or another replica ended it. The job's slot
    and its session are let go (both idempotent): else the slot would wait for its TTL, and the session's next
    turn for its recheck."""
    job_id = runner.job_id
    try:
        view = (await deps.writer.store.views([job_id]))[0]
        if view is None or not view.status.terminal:
            return  # another replica drives it: its slot and its session are that replica's
        if runner.has_slot:
            await deps.gate.release(job_id, freed=runner.ran, upstream=runner.slot_upstream)
        if deps.conversations is not None:
            await deps.conversations.ended(view, deps.clock.now_ms(), look_up=False)
    except Exception as error:  # an outage: the slot's TTL and the next turn's recheck let them go
        if not is_outage(error):
            log_failure(get_logger(__name__), error, outage="", bug="Could not let an ended job go.", job=job_id)


async def still_its_own(deps: Deps, runner: Runner, ending: Ending) -> Ending | None:
    """A runner whose write failed (PARKED) hands its slot back only while the job is still its own (its lease
    renewed): a replica frozen past its lease, or cut off from Redis, finds the job taken over (LOST), and the slot
    the new owner's. None: Redis out of reach."""
    if ending is not Ending.PARKED or not runner.has_slot:
        return ending
    try:
        held = await deps.leases.renew(runner.job_id, runner.token, deps.clock.now_ms())
    except Exception as error:
        outage, bug = "Lost Redis handing a job back.", "Could not check a job's run lease."
        log_failure(get_logger(__name__), error, outage=outage, bug=bug, job=runner.job_id)
        return None
    return Ending.PARKED if held else Ending.LOST
