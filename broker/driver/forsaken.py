"""Runs Hermes created for a job after the replica that asked lost the job (SPEC S4 "One job, one thread, one Hermes
run at a time"): a replica frozen past its run lease while its create was on its way thaws to Hermes's answer, and
another replica has taken the job over meanwhile; or the write that records the run failed on Redis, and the job
goes again. Hermes 0.19 ignores the create's Idempotency-Key, so the next create made a second run of the job: the
forsaken one is stopped. An upstream that replays a create by its key (upstream main) answered the next create with
this very run, which is then left to the job.

Whose run it is shows once the job's view records a run of that attempt or later (the new owner's), or the job
ended: until then the run is watched (every RUNS_POLL_INTERVAL, at most RUNS_HOLD). A stop Hermes does not answer is
left to the upstream's prober, as a run left on a lost upstream is (broker/driver/prober.py).

A drain is the one case where the replica still holds the job: it waits for the answer and records the run itself
(Runner.record_unrecorded), so the watch finds the job following it, or stops it itself when the job ended meanwhile
(the process exits next, before the watch would).
"""

from __future__ import annotations

import asyncio
import contextlib

from attrs import frozen

from broker.driver.deps import Deps
from broker.errors import JobNotFound
from broker.hermes.models import Accepted, CreateOutcome, NotFound, Rejected, StopOutcome, Stopping
from broker.logging import get_logger
from broker.store.outage import is_outage, log_failure


@frozen
class Unrecorded:
    """A create of the job's `attempt` on `upstream` whose answer its runner stopped waiting for, or recording."""

    create: asyncio.Future[CreateOutcome]
    attempt: int
    upstream: str | None


def when_answered(deps: Deps, job_id: str, unrecorded: Unrecorded) -> None:
    """The runner stopped waiting for its create (its lease lost, the job taken over, a drain): a run Hermes accepts
    for it after all is forsaken unless the job follows it."""

    def answered(done: asyncio.Future[CreateOutcome]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        outcome = done.result()
        if isinstance(outcome, Accepted):
            forsake(deps, job_id, unrecorded.attempt, unrecorded.upstream, outcome.run_id)

    unrecorded.create.add_done_callback(answered)


async def answered(
    deps: Deps, job_id: str, token: str, unrecorded: Unrecorded, timeout_s: float, *, slot: bool
) -> bool:
    """Wait for Hermes's answer to the create within `timeout_s`, keeping the job's run lease and (`slot`) its
    admission slot, so no other create goes in its place (a drain stopped their renewals); False: no answer, or the
    lease lost."""
    loop, leases, create = asyncio.get_running_loop(), deps.leases, unrecorded.create
    deadline = loop.time() + timeout_s
    while await leases.renew(job_id, token, now := deps.clock.now_ms()):
        if slot:
            await deps.gate.hold([job_id], now, renew_only=True, upstream=unrecorded.upstream)
        if create.done():
            return not create.cancelled() and create.exception() is None
        left = deadline - loop.time()
        if left <= 0:
            return False
        await asyncio.wait({create}, timeout=min(left, leases.lease_ms / 3000))
    return False


def forsake(deps: Deps, job_id: str, attempt: int, upstream: str | None, run_id: str) -> None:
    """Hermes accepted `run_id` for the job's `attempt` after this replica lost the job: stop it unless the job's
    owner follows it (in the background; the replica keeps a reference until it is done)."""
    task = asyncio.create_task(
        _stop_unless_followed(deps, job_id, attempt, upstream, run_id), name=f"forsaken-{run_id}"
    )
    deps.background.add(task)
    task.add_done_callback(deps.background.discard)


async def _stop_unless_followed(deps: Deps, job_id: str, attempt: int, upstream: str | None, run_id: str) -> None:
    log = get_logger(__name__)
    fields = {"job": job_id, "hermesRun": run_id, "upstream": upstream}
    try:
        deadline = deps.clock.now_ms() + deps.policy.hold_ms
        while True:
            try:
                view = (await deps.writer.load(job_id)).view
            except JobNotFound:
                break  # expired: nobody follows the run
            except Exception as error:  # Redis out of reach (often why the run went unrecorded): look again
                if not is_outage(error):
                    raise
            else:
                if view.hermes_run_id == run_id:
                    return  # the job's owner follows it: its create was answered with this run
                if view.status.terminal or view.accepted_attempt >= attempt:
                    break  # the job has another run of that attempt (or a later one), or none any more
            if deps.clock.now_ms() >= deadline:
                log.warning("A run Hermes created for a job this replica lost is left running.", extra=fields)
                return
            await asyncio.sleep(deps.poll_interval_ms / 1000)
        await stop(deps, upstream, run_id)
        log.warning("Stopped a second run Hermes created for a job this replica lost.", extra=fields)
    except Exception as error:  # a task of its own: logged here
        log_failure(
            log, error, outage="Lost Redis watching a forsaken run.", bug="Could not stop a forsaken run.", **fields
        )


async def stop(deps: Deps, upstream: str | None, run_id: str, *, timeout_s: float | None = None) -> None:
    """Stop a run no job follows; one Hermes does not answer (within `timeout_s`) is left to the upstream's prober (an
    orphan)."""
    outcome: StopOutcome | None = None
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            outcome = await deps.client(upstream).stop(run_id)
    if not isinstance(outcome, Stopping | NotFound | Rejected):
        await deps.gate.store.health.orphan(upstream, run_id, deps.clock.now_ms())
