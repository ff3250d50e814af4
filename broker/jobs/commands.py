"""The commands a caller gives the broker, validated: what a create forwards and keeps, an approval's choice.

Parsing them from HTTP is `broker/http/schemas.py`; the service and the driver only ever see these.
"""

from __future__ import annotations

from attrs import field, frozen

from broker.admission.fair import SchedulingRequest
from broker.events import Context, Reporting


@frozen(kw_only=True)
class CreateRun:
    """A validated create: what is forwarded to Hermes and what stays with the broker."""

    body: bytes  #: the execution body (JSON), only the forwarded fields
    fingerprint: str
    idempotency_key: str | None
    session_key: str | None
    session_id: str | None
    model: str | None
    context: Context | None
    reporting: Reporting
    scheduling: SchedulingRequest = field(factory=SchedulingRequest)  #: as given; resolved by the service (SPEC S4.2)
    #: `session_history` as given (SPEC S4.3); None: not given, RUNS_SESSION_HISTORY decides where it can apply
    session_history: bool | None = None
    callback_url: str | None = None  #: `callback.url`, its host allowed (SPEC S5.8)


@frozen
class ApprovalChoice:
    """A validated approval (SPEC S3.5; aliases and `all` as Hermes accepts them)."""

    choice: str  #: once | session | always | deny
    resolve_all: bool = False

    def body(self) -> dict[str, object]:
        return {"choice": self.choice, "all": True} if self.resolve_all else {"choice": self.choice}
