"""How one job row changes: pure functions from a Job (and ``now``) to the next Job.

The store applies each result with a compare-and-set; nothing here does I/O.
"""

from __future__ import annotations

import json
import math
import secrets
from dataclasses import replace
from typing import Any

from sp00ky_infra.policy.jobs import (
    RETRY_STRATEGIES,
    backoff,
    job_deadline_seconds,
    queue_deadline,
    retry_or_fail,
)
from sp00ky_infra.store.model import (
    CANCELLED,
    LEASE_EXPIRED,
    QUEUE_TIMEOUT,
    TIMEOUT,
    AttemptEntry,
    ErrorEntry,
    InvalidJob,
    Job,
    JobStatus,
    NewJob,
)


def new_attempt_id() -> str:
    return secrets.token_hex(8)


def new_job_id(table: str) -> str:
    return f"{table}:{secrets.token_hex(10)}"


_FIELD_NAMES = {"delay_ms": "delay"}  # as validate_new's messages name them


def validate_new(new: NewJob) -> None:
    # Whole numbers are ints (not floats, not bools) and durations finite numbers: what is
    # written is what rows.pending_job says was, on SQLite and PostgreSQL alike.
    for name in ("max_retries", "delay_ms", "priority", "slots"):
        value = getattr(new, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidJob(
                f"{_FIELD_NAMES.get(name, name)}: must be a whole number, not {value!r}"
            )
    for name in ("timeout", "queue_timeout", "max_job_duration"):
        value = getattr(new, name)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            raise InvalidJob(f"{name}: must be a finite number of seconds, not {value!r}")
    checks: list[tuple[bool, str]] = [
        (bool(new.backend), "backend: name the backend that runs the job"),
        (bool(new.table), "table: the backend's outbox table is required"),
        (new.path.startswith("/"), f"path: {new.path!r} must start with / (a route of the spec)"),
        (
            new.path.isascii() and new.path.isprintable() and " " not in new.path,
            f"path: {new.path!r} must be printable ASCII without spaces (the agent sends it "
            "as it is in the POST's request line: percent-encode anything else)",
        ),
        (new.max_retries >= 0, f"max_retries: must be 0 or more, not {new.max_retries}"),
        (
            new.retry_strategy in RETRY_STRATEGIES,
            f"retry_strategy: must be linear or exponential, not {new.retry_strategy!r}",
        ),
        (new.delay_ms >= 0, f"delay: must be 0 or more milliseconds, not {new.delay_ms}"),
        (
            new.timeout is None or new.timeout > 0,
            f"timeout: must be a positive number of seconds, not {new.timeout}",
        ),
        (new.slots >= 1, f"slots: a job takes at least 1 slot, not {new.slots}"),
        (
            new.queue_timeout is None or new.queue_timeout > 0,
            f"queue_timeout: must be positive, not {new.queue_timeout}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise InvalidJob(message)
    try:
        json.dumps(new.payload)
    except (TypeError, ValueError) as exc:
        raise InvalidJob(f"payload: must be JSON ({exc})") from exc


def error_entry(code: str, reason: str, job: Job, now: float, **extra: Any) -> ErrorEntry:
    entry: ErrorEntry = {"code": code, "reason": reason, "at": now, "attempt": job.attempt_number}
    entry.update(extra)  # type: ignore[typeddict-item]
    return entry


def attempt_entry(number: int, attempt: str, machine: str | None, now: float) -> AttemptEntry:
    """The history entry of an attempt started at ``now``: what rows.job_from_row makes of
    the columns of a row running it (the claim writes no entry)."""
    return {
        "id": attempt,
        "number": number,
        "machine": machine,
        "started_at": now,
        "ended_at": None,
        "outcome": None,
    }


def attempt_deadline(
    timeout: float | None, max_job_duration: float | None, now: float
) -> float | None:
    """When an attempt started at ``now`` must have ended (its timeout, the pool's maximum)."""
    limit = job_deadline_seconds(timeout, max_job_duration)
    return None if limit is None else now + limit


def end_attempt(job: Job, now: float, outcome: str) -> tuple[AttemptEntry, ...]:
    if not job.attempts or job.status != "processing":
        return job.attempts
    last: AttemptEntry = {**job.attempts[-1], "ended_at": now, "outcome": outcome}
    return (*job.attempts[:-1], last)


def finish(
    job: Job,
    status: JobStatus,
    now: float,
    result: Any = None,
    error: ErrorEntry | None = None,
    late_result: Any = None,
) -> Job:
    errors = job.errors
    if error is not None:
        if late_result is not None:
            error = {**error, "result": late_result}
        errors = (*errors, error)
    outcome = status if error is None else error["code"]
    return replace(
        job,
        status=status,
        result=result,
        errors=errors,
        attempts=end_attempt(job, now, outcome),
        lease_expires_at=None,
        cancel_requested=False,
        finished_at=now,
        updated_at=now,
    )


def after_failure(
    job: Job, error: ErrorEntry, now: float, retryable: bool, claim_expired: bool = False
) -> Job:
    """The current attempt failed with ``error``: retry after backoff while retries remain,
    else fail. A killed job fails with ``cancelled`` whatever the error. An expired claim
    (``claim_expired``: its lease ran out) keeps the queue deadline it was first given
    (Resource pools docs: "an expired claim can be admitted again before its queue deadline");
    a retry after a reported failure waits anew."""
    error = {**error, "at": now, "attempt": job.attempt_number}
    if job.cancel_requested:
        cancelled = error_entry(CANCELLED, f"killed while it ran ({error['code']})", job, now)
        return finish(job, "failed", now, error=cancelled)
    if retryable and retry_or_fail(job.retries, job.max_retries):
        retry_number = job.retries + 1
        run_after = now + backoff(job.retry_strategy, retry_number)
        return requeued(
            job,
            now,
            run_after,
            retries=retry_number,
            errors=(*job.errors, error),
            attempts=end_attempt(job, now, error["code"]),
            queue_deadline=job.queue_deadline
            if claim_expired
            else queue_deadline(run_after, job.queue_timeout),
        )
    return finish(job, "failed", now, error=error)


def overdue(job: Job, now: float) -> tuple[str, Job] | None:
    """What the recovery sweep does to ``job`` at ``now``: (error code, next state), or None.

    A running attempt whose lease ran out, or that ran past its deadline, fails (and is
    retried while retries remain); a job that waited past its queue deadline fails for good.
    """
    where = f" on machine {job.machine}" if job.machine else ""
    if job.status == "processing":
        if job.lease_expires_at is not None and job.lease_expires_at < now:
            reason = f"no renewal within the lease{where}"
            return LEASE_EXPIRED, after_failure(
                job, error_entry(LEASE_EXPIRED, reason, job, now), now, True, claim_expired=True
            )
        if job.deadline is not None and job.deadline < now:
            reason = f"ran past its deadline{where}"
            return TIMEOUT, after_failure(job, error_entry(TIMEOUT, reason, job, now), now, True)
    if job.status == "pending" and job.queue_deadline is not None and job.queue_deadline < now:
        reason = "waited longer than its queue timeout for a free slot"
        return QUEUE_TIMEOUT, finish(
            job, "failed", now, error=error_entry(QUEUE_TIMEOUT, reason, job, now)
        )
    return None


def rerun(job: Job, now: float) -> Job:
    """A finished job made pending again by hand: a fresh retry budget, its history kept."""
    return requeued(job, now, now, retries=0, result=None, cancel_requested=False, finished_at=None)


def requeued(job: Job, now: float, run_after: float, **changes: Any) -> Job:
    """Back in the queue, due at ``run_after``: no attempt, machine, lease or deadline, and a
    fresh queue deadline counted from when it is due unless ``changes`` keeps the old one."""
    return replace(
        job,
        **{
            "status": "pending",
            "run_after": run_after,
            "queue_deadline": queue_deadline(run_after, job.queue_timeout),
            "attempt": None,
            "machine": None,
            "lease_expires_at": None,
            "deadline": None,
            "updated_at": now,
            **changes,
        },
    )
