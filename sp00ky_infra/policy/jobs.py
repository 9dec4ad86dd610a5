"""Pure job decisions: retry backoff, a job's deadline, and admission from a queue.

Nothing here does I/O or reads the clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
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


# --- Bounds on what a job's creator may ask for (docs/jobs.md, "Limits") -------------------------
# Every number a job takes is bounded, so that no value overflows the store's 64-bit columns
# or turns a retry, a delay or a timeout into "forever". The docs give no numbers; these
# are far past any real use and far below any overflow.
MAX_RETRIES = 100
PRIORITY_BOUND = 1_000_000  # priority and queuePriority: -1,000,000 to 1,000,000
MAX_DELAY_MS = 30 * 24 * 3600 * 1000  # 30 days, in milliseconds
MAX_SLOTS = 1024  # slots and poolSlots (a job must also fit on one of its pool's machines)
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600.0  # 7 days (the pool's maxJobDuration still applies)
# A payload or a result is JSON of at most this depth (objects and arrays nested in each
# other); deeper documents are refused at input, before any parser recurses into them.
MAX_JSON_DEPTH = 64
# A payload, and a result an agent posts, as JSON text (the APIs' body limits add room for
# the other fields: controller/limits.py).
MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_RESULT_BYTES = 1024 * 1024


def bound_problem(
    *,
    max_retries: int,
    priority: int,
    delay_ms: int,
    slots: int,
    timeout: float | None,
    names: dict[str, str] | None = None,
) -> str | None:
    """The first number out of its bounds, as a message naming the field (``names`` maps a
    field to the spelling its caller used, e.g. ``priority`` to ``--queue-priority``)."""
    named = names or {}

    def name(field: str) -> str:
        return named.get(field, field)

    if not 0 <= max_retries <= MAX_RETRIES:
        return f"{name('max_retries')}: must be 0 to {MAX_RETRIES}, not {max_retries}"
    if not -PRIORITY_BOUND <= priority <= PRIORITY_BOUND:
        return f"{name('priority')}: must be {-PRIORITY_BOUND} to {PRIORITY_BOUND}, not {priority}"
    if not 0 <= delay_ms <= MAX_DELAY_MS:
        return (
            f"{name('delay')}: must be 0 to {MAX_DELAY_MS} milliseconds (30 days), not {delay_ms}"
        )
    if not 1 <= slots <= MAX_SLOTS:
        return f"{name('slots')}: a job takes 1 to {MAX_SLOTS} slots, not {slots}"
    if timeout is not None and not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_SECONDS):
        return (
            f"{name('timeout')}: must be more than 0 and at most {MAX_TIMEOUT_SECONDS:.0f} "
            f"seconds (7 days), not {timeout}"
        )
    return None


def json_problem(value: object, where: str, max_depth: int = MAX_JSON_DEPTH) -> str | None:
    """Why ``value`` (parsed JSON, or what a caller means to store as JSON) is not valid JSON
    within ``max_depth``: a NaN or an infinity, a non-JSON type, or too deep; None when it is.

    Walks iteratively, so a 60,000-deep document costs no recursion. The message names the
    place: ``payload.scores[2]`` (``where`` empty: a request body, whose fields are named
    bare, and which itself is called ``body``).
    """
    stack: list[tuple[object, str, int]] = [(value, where, 0)]
    while stack:
        item, place, depth = stack.pop()
        label = place or "body"
        if isinstance(item, dict | list):
            if depth >= max_depth:
                return (
                    f"{label}: nested deeper than {max_depth} levels of objects and arrays; "
                    "flatten it"
                )
            if isinstance(item, dict):
                for key, child in item.items():
                    if not isinstance(key, str):
                        return f"{label}: key {key!r} is not a string; JSON keys are strings"
                    stack.append((child, f"{place}.{key}" if place else key, depth + 1))
            else:
                stack.extend((child, f"{place}[{i}]", depth + 1) for i, child in enumerate(item))
        elif isinstance(item, float):
            if not math.isfinite(item):
                return f"{label}: {item} is not a JSON number; send a finite number or null"
        elif not (item is None or isinstance(item, str | int | bool)):
            return f"{label}: a {type(item).__name__} is not JSON"
    return None


@dataclass(frozen=True, slots=True)
class Route:
    """Where a backend's pooled jobs wait now: its outbox table and the pool it runs on."""

    table: str | None
    pool: str | None


def orphaned(
    waiting: Iterable[tuple[str, str, str]], routes: Mapping[str, Route]
) -> dict[tuple[str, str, str], str]:
    """The (backend, table, pool) groups of waiting pooled jobs that no pool will ever take,
    each with why: the backend is gone from sp00ky.yml, or runs on another pool or none, or
    reads another table (the Resource pools docs: a changed, disabled or removed job cancels
    its waiting entries). ``routes``: each backend the configuration declares."""
    found = {}
    for backend, table, pool in waiting:
        route = routes.get(backend)
        if route is None:
            found[backend, table, pool] = f"backend {backend} was removed from sp00ky.yml"
        elif route.pool != pool:
            now_on = f"pool {route.pool}" if route.pool else "no pool"
            found[backend, table, pool] = (
                f"backend {backend} no longer runs on pool {pool} (it runs on {now_on} now)"
            )
        elif route.table != table:
            found[backend, table, pool] = (
                f"backend {backend} now reads outbox table {route.table}, not {table}"
            )
    return found
