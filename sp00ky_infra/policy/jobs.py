"""Pure job decisions: retry backoff, a job's deadline, and admission from a queue.

Nothing here does I/O or reads the clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

RetryStrategy = Literal["linear", "exponential"]
RETRY_STRATEGIES: tuple[RetryStrategy, ...] = ("linear", "exponential")

# The docs give no numbers for backoff. A retry waits base x n (linear) or base x 2^(n-1)
# (exponential) seconds before it is eligible again, n being the retry's number (1, 2, ...),
# never more than the cap: linear 5s, 10s, 15s ...; exponential 5s, 10s, 20s, 40s ... 10m.
BACKOFF_BASE_SECONDS = 5.0
BACKOFF_CAP_SECONDS = 600.0


def backoff(
    strategy: RetryStrategy,
    retry_number: int,
    base: float = BACKOFF_BASE_SECONDS,
    cap: float = BACKOFF_CAP_SECONDS,
) -> float:
    """Seconds to wait before retry number ``retry_number`` (1 for the first retry)."""
    if retry_number < 1:
        raise ValueError(f"retry_number starts at 1, got {retry_number}")
    if strategy == "linear":
        delay = base * retry_number
    elif strategy == "exponential":
        delay = base * 2.0 ** min(retry_number - 1, 62)
    else:
        raise ValueError(f"retry strategy must be linear or exponential, not {strategy!r}")
    return min(delay, cap)


def job_deadline_seconds(timeout: float | None, max_job_duration: float | None) -> float | None:
    """How long one attempt may run: the shorter of the job's timeout and the pool's maximum.

    A job's own timeout shortens the pool's maxJobDuration, never extends it.
    """
    limits = [limit for limit in (timeout, max_job_duration) if limit is not None]
    return min(limits) if limits else None


def admission_key(priority: int, created_at: float, job_id: str) -> tuple[int, float, str]:
    """A job's place in its queue: higher priority first, then older, then by id (the store's
    ``ORDER BY priority DESC, created_at, id`` is this key; a test holds them equal)."""
    return (-priority, created_at, job_id)


def queue_deadline(run_after: float, queue_timeout: float | None) -> float | None:
    """When a waiting job gives up: its queue timeout counted from when it is due."""
    return None if queue_timeout is None else run_after + queue_timeout


def queue_expired(deadline: float | None, now: float) -> bool:
    """Whether the recovery sweep fails a waiting job at ``now`` (queue_timeout)."""
    return deadline is not None and deadline < now


def claimable(deadline: float | None, now: float) -> bool:
    """Whether a due job may still be claimed at ``now``: not at or past its queue deadline."""
    return deadline is None or deadline > now


@dataclass(frozen=True, slots=True)
class Queued:
    """What admission needs to know of a waiting job, in admission order."""

    id: str
    slots: int = 1


def admit(
    queue: Iterable[Queued],
    free_slots: int,
    in_flight: int = 0,
    concurrency: int | None = None,
) -> list[str]:
    """The jobs, from the head of ``queue``, that start now.

    ``queue`` is in admission order (priority, then created_at, then id). Each job takes
    ``slots`` of ``free_slots``; the head waits until all the slots it needs are free, and
    nothing behind it overtakes it. ``concurrency`` caps the table's jobs in flight.
    """
    admitted: list[str] = []
    for job in queue:
        if concurrency is not None and in_flight + len(admitted) >= concurrency:
            break
        if job.slots > free_slots:
            break  # head-of-line: the head waits, and so does everything behind it
        admitted.append(job.id)
        free_slots -= job.slots
    return admitted


def retry_or_fail(retries: int, max_retries: int) -> bool:
    """Whether a failed attempt is retried: while fewer than ``max_retries`` retries were made."""
    return retries < max_retries
