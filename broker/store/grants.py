"""What the admission store answers (broker/store/admission.py): grants of a pass, acceptances, refusals."""

from __future__ import annotations

from attrs import frozen


@frozen
class Grant:
    job_id: str
    token: str  #: the run lease taken with the grant
    stored: dict[str, str]  #: the job's view hash as claimed (the fields it has), for its runner
    created: str | None  #: its JobCreated event JSON (the execution body), for its runner
    upstream: str | None = None  #: the upstream whose slot it holds (SPEC S10); None: it waits, without a slot
    moved_from: str | None = None  #: the upstream it was bound to, down too long (SPEC S10)
    moved_because: str | None = None  #: why it moved (`job.rerouted` reason)
    place: str | None = None  #: its score in the line when claimed (a turn that waits for its session keeps it)
    held: bool = False  #: its key is at its quota or budget (SPEC S4.4): it waits out of the line, undriven
    #: it waited for its key's quota until then (epoch ms; 0: it did not): its wait for Hermes begins then, the
    #: quota's wait does not count towards RUNS_HOLD
    waited_until_ms: int = 0


@frozen
class Grants:
    grants: list[Grant]  #: granted, oldest first, each with its run lease
    wake_at_ms: int | None  #: when a probe may go while Hermes refuses
    more: bool = False  #: slots it reserved went unused (jobs held by their quotas): pass again at once

    @property
    def jobs(self) -> list[str]:
        return [grant.job_id for grant in self.grants]


@frozen
class Refusal:
    retry_at_ms: int  #: the line's next probe
    began: bool  #: this refusal began a refusal streak
    limit: int
    limit_changed: bool


@frozen
class Acceptance:
    limit: int
    grew: bool
    ended_refusal: bool
