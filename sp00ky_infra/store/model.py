"""Job rows as values, and the store's errors.

StoreError (root)
├── JobNotFound        no job has that id
├── InvalidJob         a new job's fields are wrong (names the field)
├── QueueFull          the pool's maxQueued jobs are already waiting
├── Conflict           the job is not in a state that allows the operation
│   └── StaleAttempt   a report for an attempt that is no longer current (fencing)
└── StoreUnavailable   the store cannot be reached or opened
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict

from sp00ky_infra.policy.jobs import RetryStrategy

JobStatus = Literal["pending", "processing", "success", "failed"]
STATUSES: tuple[JobStatus, ...] = ("pending", "processing", "success", "failed")
TERMINAL: tuple[JobStatus, ...] = ("success", "failed")

# Error codes written on a job's `errors` (docs/jobs.md, the error codes).
LEASE_EXPIRED = "lease_expired"
CANCELLED = "cancelled"
TIMEOUT = "timeout"
BACKEND_ERROR = "backend_error"
BACKEND_UNREACHABLE = "backend_unreachable"
BOOT_FAILED = "boot_failed"
QUEUE_TIMEOUT = "queue_timeout"


class ErrorEntry(TypedDict, total=False):
    code: str
    reason: str
    at: float
    attempt: int
    status: int  # the backend's HTTP status, for backend_error
    result: Any  # an answer that came after the job was killed


class AttemptEntry(TypedDict, total=False):
    id: str
    number: int
    machine: str | None
    started_at: float
    ended_at: float | None
    outcome: str | None


class StoreError(Exception):
    """Root of every store error."""


class JobNotFound(StoreError):
    pass


class InvalidJob(StoreError):
    pass


class QueueFull(StoreError):
    pass


class Conflict(StoreError):
    pass


class StaleAttempt(Conflict):
    pass


class StoreUnavailable(StoreError):
    pass


@dataclass(frozen=True, slots=True)
class NewJob:
    """A job to write: the row `run` creates (the docs' db.run())."""

    backend: str
    table: str
    path: str
    payload: Any = None
    max_retries: int = 3
    retry_strategy: RetryStrategy = "linear"
    delay_ms: int = 0
    timeout: float | None = None  # seconds; shortens the pool's maxJobDuration
    priority: int = 0
    slots: int = 1
    pool: str | None = None
    assigned_to: str | None = None
    queue_timeout: float | None = None  # seconds a job may wait once eligible
    max_job_duration: float | None = None  # the pool's; with timeout, bounds each attempt


@dataclass(frozen=True, slots=True)
class Recorded:
    """What ``complete_many`` did with one result: the job's status after it, the code of its
    last error (``cancelled`` for a job killed while it ran, else ""), and when the attempt
    started; or ``refused``, the error that kept the result out (StaleAttempt, JobNotFound,
    Conflict), for that result alone."""

    job: str
    attempt: str
    status: JobStatus | None = None
    code: str = ""
    started_at: float | None = None
    refused: StoreError | None = None


@dataclass(frozen=True, slots=True)
class Running:
    """A job running on a machine as a poll reads it (``send_running``): what checks the
    attempts the machine reports, counts its slots, passes its kills on and times the
    attempts whose results it records. A few columns, not the whole row: the whole Job is
    read only for what needs it (an assignment sent again, a result posted on its own)."""

    id: str
    attempt: str | None
    slots: int
    cancel_requested: bool
    started_at: float | None


@dataclass(frozen=True, slots=True)
class Started:
    """An attempt a claim started, as a poll hands it to its machine (``send_start``): what the
    agent's assignment and the dispatch measure need. A few columns, not the whole row: a
    poll's claim spares decoding every job's JSON in Python."""

    id: str
    attempt: str
    path: str
    payload: Any
    deadline: float | None
    lease_expires_at: float
    run_after: float


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    backend: str
    table: str
    path: str
    payload: Any
    status: JobStatus
    retries: int
    max_retries: int
    retry_strategy: RetryStrategy
    delay_ms: int
    timeout: float | None
    errors: tuple[ErrorEntry, ...]
    result: Any
    assignee: str | None
    assigned_to: str | None
    created_at: float
    updated_at: float
    pool: str | None
    priority: int
    slots: int
    run_after: float
    queue_timeout: float | None
    queue_deadline: float | None
    max_job_duration: float | None
    attempt: str | None
    attempt_number: int
    machine: str | None
    lease_expires_at: float | None
    deadline: float | None
    cancel_requested: bool
    started_at: float | None
    finished_at: float | None
    attempts: tuple[AttemptEntry, ...] = field(default=())

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Job:
        """The job ``as_json`` gave (the admin API's answer, for ``--cloud``)."""
        fields: dict[str, Any] = {name: data.get(name) for name in cls.__dataclass_fields__}
        fields.update(
            table=data["table"],
            delay_ms=data.get("delay", 0),
            errors=tuple(data.get("errors") or ()),
            attempts=tuple(data.get("attempts") or ()),
            cancel_requested=bool(data.get("cancel_requested")),
        )
        return cls(**fields)

    def as_json(self) -> dict[str, Any]:
        """Every field, JSON-ready (``jobs get --json``)."""
        return {
            "id": self.id,
            "backend": self.backend,
            "table": self.table,
            "path": self.path,
            "status": self.status,
            "payload": self.payload,
            "result": self.result,
            "errors": list(self.errors),
            "retries": self.retries,
            "max_retries": self.max_retries,
            "retry_strategy": self.retry_strategy,
            "delay": self.delay_ms,
            "timeout": self.timeout,
            "priority": self.priority,
            "slots": self.slots,
            "pool": self.pool,
            "assigned_to": self.assigned_to,
            "assignee": self.assignee,
            "machine": self.machine,
            "attempt": self.attempt,
            "attempt_number": self.attempt_number,
            "attempts": list(self.attempts),
            "lease_expires_at": self.lease_expires_at,
            "deadline": self.deadline,
            "queue_timeout": self.queue_timeout,
            "queue_deadline": self.queue_deadline,
            "run_after": self.run_after,
            "cancel_requested": self.cancel_requested,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }
