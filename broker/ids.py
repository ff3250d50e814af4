"""Id helpers: job ids, replica ids, upstream idempotency keys, execution fingerprints (no IO but the host name)."""

from __future__ import annotations

import hashlib
import os
import secrets
import socket

import orjson

from broker.events import thread_key

__all__ = [
    "fingerprint",
    "is_job_id",
    "job_id_for_key",
    "new_job_id",
    "new_replica_id",
    "thread_key",
    "upstream_key",
]

JOB_PREFIX = "job_"


def job_id_for_key(idempotency_key: str) -> str:
    """The job id an Idempotency-Key claims: the claim is then local to the job's own keys."""
    return JOB_PREFIX + hashlib.sha256(idempotency_key.encode()).hexdigest()[:32]


def new_job_id() -> str:
    return JOB_PREFIX + secrets.token_hex(16)


def new_replica_id() -> str:
    """A broker process's id, `<host>-<pid>-<random>`: its log lines carry it, and jobs it drives show it."""
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def is_job_id(value: str) -> bool:
    rest = value[len(JOB_PREFIX) :]
    return value.startswith(JOB_PREFIX) and len(rest) == 32 and all(c in "0123456789abcdef" for c in rest)


def upstream_key(job_id: str, attempt: int) -> str:
    """Hermes Idempotency-Key of an attempt: the job id for the first, `<job>#<n>` after."""
    return job_id if attempt <= 1 else f"{job_id}#{attempt}"


def fingerprint(input_value: object, instructions: object) -> str:
    """The execution fingerprint (SPEC S3.1.1): `input` + `instructions` only."""
    canonical = orjson.dumps({"input": input_value, "instructions": instructions}, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()
