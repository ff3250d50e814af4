"""The Redis key schema, declared once. No key string appears anywhere else.

key               type    holds                                               TTL / writer
hbr:{J}:events    stream  the job's events, field `e` = JSON; id = SSE id     RUNS_RETENTION; http, driver (fenced)
hbr:{J}:view      hash    `state` = job view JSON, `last_id` = id folded to   RUNS_RETENTION; same script as append
hbr:{J}:lease     string  run lease token                                     RUNS_LEASE; driver
hbr:{J}:board     hash    latest board report, pending and acked versions     until expiry; same script as append
hbr:work          stream  doorbells: job ids to drive; group `drivers`; ~100k  acked+deleted; http, scheduler
hbr:due           zset    job id -> epoch ms of its next wake-up              none; driver
hbr:board:outbox  stream  due board deliveries; group `senders`               acked; projector, scheduler
hbr:board:due     zset    key -> when a coalesced refresh is due              none; projector
hbr:board:index   zset    key -> sourceActivityAt + HERMES_TTL                none; projector
hbr:lock:<name>   string  token-owned locks                                   lock TTL; sender, reconciler
  hbr:lock:board:<J>       one board key's deliveries                       longest delivery; sender
  hbr:lock:board:reconcile one reconciliation pass per interval             BOARD_RECONCILE_INTERVAL; reconciler
hbr:signals       pubsub  job ids whose owner should re-read their stream     -; http (stop, approval)
hbr:{adm}:line    zset    jobs waiting for Hermes -> arrival order (S4.1)     none; job write (enter/leave), admission
hbr:{adm}:live    zset    jobs holding an admission slot -> slot expiry ms    none; admission (granted, renewed, freed)
hbr:{adm}:slots   hash    job holding a slot -> its place in the line         none; admission
hbr:{adm}:state   hash    the learnt limit and the refusal (probe) state      none; admission
hbr:runs          zset    job id -> updated_at ms: every job (GET /v1/runs)   past RUNS_RETENTION; same script as append
hbr:runs:<status> zset    the same, one per job status (the status filter)    past RUNS_RETENTION; same script as append

`{J}` is the job id as a Redis Cluster hash tag: every per-job key lives in one slot, so every
per-job atomic write is one Lua script on one node. The admission keys share the tag `{adm}`, so
every admission script touches one slot (the job write's line entry is still a second slot, like
`hbr:work`: SPEC S9 partitions them).
"""

from __future__ import annotations

PREFIX = "hbr"
EVENT_FIELD = "e"

WORK = f"{PREFIX}:work"
WORK_GROUP = "drivers"
DUE = f"{PREFIX}:due"
SIGNALS = f"{PREFIX}:signals"  # pub/sub: a job id whose owner should look at its stream now
BOARD_OUTBOX = f"{PREFIX}:board:outbox"
BOARD_OUTBOX_GROUP = "senders"
BOARD_DUE = f"{PREFIX}:board:due"
BOARD_INDEX = f"{PREFIX}:board:index"
RUNS_INDEX = f"{PREFIX}:runs"

_ADMISSION = f"{PREFIX}:{{adm}}"
ADMISSION_LINE = f"{_ADMISSION}:line"
ADMISSION_LIVE = f"{_ADMISSION}:live"
ADMISSION_SLOTS = f"{_ADMISSION}:slots"
ADMISSION_STATE = f"{_ADMISSION}:state"


def events(job_id: str) -> str:
    return f"{PREFIX}:{{{job_id}}}:events"


def view(job_id: str) -> str:
    return f"{PREFIX}:{{{job_id}}}:view"


def lease(job_id: str) -> str:
    return f"{PREFIX}:{{{job_id}}}:lease"


def board(job_id: str) -> str:
    return f"{PREFIX}:{{{job_id}}}:board"


def runs_index(status: str) -> str:
    """The listing index of the jobs in one status (SPEC S3.9); `RUNS_INDEX` holds every job."""
    return f"{RUNS_INDEX}:{status}"


def lock(name: str) -> str:
    return f"{PREFIX}:lock:{name}"


def board_lock(job_id: str) -> str:
    """The token-owned lock under which one replica delivers a board key's versions (SPEC S5.3)."""
    return lock(f"board:{job_id}")


BOARD_RECONCILE_LOCK = lock("board:reconcile")


def job_id_of(key: str) -> str | None:
    """The job id inside a per-job key (for SCAN-based tools), or None."""
    start, end = key.find("{"), key.find("}")
    return key[start + 1 : end] if 0 <= start < end else None
