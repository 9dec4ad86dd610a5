"""Job rows: the columns, the statements that write whole rows, and the mapping to ``Job``.

``UPDATE_JOB`` and ``update_row`` (and ``INSERT_JOB`` and ``insert_row``) agree column by column.

The hot path (a claim starting attempts, a result ending one) does not rewrite whole rows: its
statements change the columns that change, once a batch of several rows: SQLite with the
rows' values in VALUES, PostgreSQL with them as arrays (one round trip; ``%b``: sent in
binary, which spares psycopg quoting every element of a text array); a single result with
the one-row statement (cheaper to send, bind and plan than a join).

Nor does it write the attempt history (the ``attempts`` column, JSON): the entry of the
attempt a row runs, or of the one a result ended in success, is the row's own columns
(attempt, attempt_number, machine, started_at, finished_at), which ``job_from_row`` turns
into the history's last entry; the column holds the entries before it, and the entries a
transition in Python ended (``update_row`` writes them). Rewriting that JSON on every start
and end would cost the server more than the rest of the statement.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Generic, TypeVar

from sp00ky_infra.store.model import TERMINAL, AttemptEntry, Job, NewJob, Started
from sp00ky_infra.store.transitions import attempt_entry

T = TypeVar("T")

COLUMNS = (
    "id, backend, tbl, path, payload, status, retries, max_retries, retry_strategy, delay_ms, "
    "timeout, errors, result, assignee, assigned_to, created_at, updated_at, pool, priority, "
    "slots, run_after, queue_timeout, queue_deadline, max_job_duration, attempt, "
    "attempt_number, machine, lease_expires_at, deadline, cancel_requested, started_at, "
    "finished_at, attempts"
)
_COLUMN_NAMES = [name.strip() for name in COLUMNS.split(",")]
QUEUE_ORDER = "priority DESC, created_at, id"
UPDATE_JOB = (
    "UPDATE jobs SET status = ?, retries = ?, errors = ?, result = ?, assignee = ?, "
    "updated_at = ?, run_after = ?, queue_deadline = ?, attempt = ?, attempt_number = ?, "
    "machine = ?, lease_expires_at = ?, deadline = ?, cancel_requested = ?, started_at = ?, "
    "finished_at = ?, attempts = ? "
    "WHERE id = ? AND status = ? AND attempt IS NOT DISTINCT FROM ? AND cancel_requested = ? "
    "AND lease_expires_at IS NOT DISTINCT FROM ?"
)
# Start attempts (SQLite; the rows read by the claim, which builds what it returns): one
# statement for the claim's rows, each with its attempt id and deadline from VALUES, each row
# found by id (``+``: the status is checked, never a way in through a partial index on
# status, which would read every pending row). One statement a claim, not one a row.
START_ATTEMPTS = (
    "UPDATE jobs SET status = 'processing', assignee = ?, machine = ?, attempt = v.column2, "
    "attempt_number = attempt_number + 1, lease_expires_at = ?, deadline = v.column3, "
    "started_at = ?, updated_at = ? "
    "FROM (VALUES {rows}) AS v WHERE jobs.id = v.column1 AND +jobs.status = 'pending'"
)
START_ROWS_MAX = 1000  # rows a statement: 3 variables each, well under SQLite's 32,766


# The slots the first ``{cap}`` eligible pending jobs of a queue need (``{tbl}``, at ``{now}``):
# a range of jobs_pending_due no longer than the cap, whatever the backlog.
QUEUE_HEAD_SLOTS = (
    "(SELECT coalesce(sum(slots), 0) FROM (SELECT slots FROM jobs WHERE tbl = {tbl} "
    "AND status = 'pending' AND run_after <= {now} LIMIT {cap}) AS head)"
)


def chunks(rows: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``rows`` in slices of at most ``size``, in order (a statement's worth each)."""
    return (rows[first : first + size] for first in range(0, len(rows), size))


def start_attempts(rows: int) -> str:
    """START_ATTEMPTS for ``rows`` rows (SQLite caches each count's statement)."""
    return START_ATTEMPTS.format(rows=", ".join(["(?, ?, ?)"] * rows))


_QUEUED_PG = (  # the rows of a queue a claim may take now (the head's, and the wall's)
    "tbl = %(table)s AND status = 'pending' AND run_after <= %(now)s "
    "AND (queue_deadline IS NULL OR queue_deadline > %(now)s)"
)
# A whole claim on PostgreSQL, in one statement after the queue's admission lock: the head of
# the queue locked in admission order, admitted as policy.jobs.admit does (the longest
# prefix whose slots fit in the free ones, ``room`` jobs at most: the concurrency left), and
# each admitted row started with the attempt id of its rank. A job's deadline is
# policy.jobs.job_deadline_seconds after now (LEAST skips NULLs as it does); ``n`` puts the
# rows back in admission order.
CLAIM_PG = (
    "WITH {wall}head AS (SELECT id, slots, priority, created_at FROM jobs "
    f"WHERE {_QUEUED_PG}{{before_wall}} "
    f"ORDER BY {QUEUE_ORDER} LIMIT %(free)s FOR UPDATE SKIP LOCKED), "
    "ranked AS (SELECT id, sum(slots) OVER w AS need, row_number() OVER w AS n FROM head "
    f"WINDOW w AS (ORDER BY {QUEUE_ORDER} ROWS UNBOUNDED PRECEDING)), "
    "chosen AS (SELECT id, n FROM ranked WHERE need <= %(free)s AND n <= {room}) "
    "UPDATE jobs SET status = 'processing', assignee = %(owner)s, machine = %(machine)s, "
    "attempt = (%(attempts)s::text[])[chosen.n], attempt_number = jobs.attempt_number + 1, "
    "lease_expires_at = %(lease)s, "
    "deadline = %(now)s + LEAST(jobs.timeout, jobs.max_job_duration), "
    "started_at = %(now)s, updated_at = %(now)s "
    "FROM chosen WHERE jobs.id = chosen.id RETURNING chosen.n, {returning}"
)
# What a claim returns of each row it started: the whole row (a Job), or a Started's columns.
WHOLE_PG = ", ".join(f"jobs.{name}" for name in _COLUMN_NAMES)
STARTED_COLUMNS = "id, attempt, path, payload, deadline, lease_expires_at, run_after"
STARTED_PG = ", ".join(f"jobs.{name}" for name in STARTED_COLUMNS.split(", "))
# Without a concurrency cap, claims of one queue share its admission lock while it holds no
# wide job (slots > 1) pending, and skip each other's rows (the lock statement,
# postgres.LOCK_QUEUE_SHARED, says which it took). Every row such a claim locks it starts
# (its rows take a slot each), so nothing behind a row another claim holds is left waiting
# for it. A wide job that became due between the lock and the claim is the wall: a claim
# under the shared lock takes only the rows ahead of it and never locks it, so that no claim
# passes it; the next claim sees it and takes the lock alone.
_CLAIM_ANY_PG = CLAIM_PG.format(
    returning="{returning}",
    room="%(free)s",
    wall=f"wall AS (SELECT priority, created_at, id FROM jobs WHERE {_QUEUED_PG} "
    "AND slots > 1 AND current_setting('sp00ky.claim_lock', true) = 'shared' "
    f"ORDER BY {QUEUE_ORDER} LIMIT 1), ",
    before_wall=" AND NOT EXISTS (SELECT 1 FROM wall WHERE wall.priority > jobs.priority "
    "OR (wall.priority = jobs.priority "
    "AND (wall.created_at, wall.id) <= (jobs.created_at, jobs.id)))",
)
# With a concurrency cap: the room left under it, counted after the lock (always held alone).
_CLAIM_CAPPED_PG = CLAIM_PG.format(
    returning="{returning}",
    room="%(concurrency)s - (SELECT count(*) FROM jobs "
    "WHERE tbl = %(table)s AND status = 'processing')",
    wall="",
    before_wall="",
)
CLAIM_ANY_PG = _CLAIM_ANY_PG.format(returning=WHOLE_PG)
CLAIM_CAPPED_PG = _CLAIM_CAPPED_PG.format(returning=WHOLE_PG)
CLAIM_ANY_STARTED_PG = _CLAIM_ANY_PG.format(returning=STARTED_PG)
CLAIM_CAPPED_STARTED_PG = _CLAIM_CAPPED_PG.format(returning=STARTED_PG)
# A result for the current attempt of a running job nobody killed (the common case): success
# (the attempt's entry ends with the row: finished_at and the status are its end and outcome).
# Any other case (killed, stale, another machine's) matches no row and takes the full
# transition in jobs.py.
COMPLETE_ATTEMPT = (
    "UPDATE jobs SET status = 'success', result = ?, updated_at = ?, finished_at = ?, "
    "lease_expires_at = NULL "
    "WHERE id = ? AND attempt = ? AND status = 'processing' AND cancel_requested = 0 "
    "AND (? IS NULL OR machine = ?) RETURNING started_at"
)
# The same for several results at once (SQLite): one statement, the results from VALUES,
# each row found by id as above; the rows it completed come back as (id, started_at).
COMPLETE_ATTEMPTS = (
    "UPDATE jobs SET status = 'success', result = v.column3, updated_at = ?, finished_at = ?, "
    "lease_expires_at = NULL "
    "FROM (VALUES {rows}) AS v WHERE jobs.id = v.column1 AND jobs.attempt = v.column2 "
    "AND +jobs.status = 'processing' AND jobs.cancel_requested = 0 "
    "AND (? IS NULL OR jobs.machine = ?) RETURNING jobs.id, jobs.started_at"
)


def complete_attempts(rows: int) -> str:
    """COMPLETE_ATTEMPTS for ``rows`` results (3 variables each)."""
    return COMPLETE_ATTEMPTS.format(rows=", ".join(["(?, ?, ?)"] * rows))


COMPLETE_ATTEMPT_PG = COMPLETE_ATTEMPT.replace("(? IS NULL OR", "(?::text IS NULL OR")
# The batched results find their rows by id (jobs_pkey, a lookup a row) whatever the
# statistics say. The status check compares with a column of the unnested arrays
# (``v.status``), a join clause, not the constant: a constant would let the planner take a
# partial index on status instead, which on a table not analyzed since a burst of enqueues
# it believes holds a dozen rows, and the UPDATE would then read every pending job.
COMPLETE_ATTEMPTS_PG = (
    "UPDATE jobs SET status = 'success', result = v.result, updated_at = %s, finished_at = %s, "
    "lease_expires_at = NULL "
    "FROM unnest(%b::text[], %b::text[], %b::text[], %b::text[]) AS v(id, attempt, result, status) "
    "WHERE jobs.id = v.id AND jobs.attempt = v.attempt AND jobs.status = v.status "
    "AND jobs.cancel_requested = 0 AND (%s::text IS NULL OR jobs.machine = %s) "
    "RETURNING jobs.id, jobs.started_at"
)
# The leases a poll renews, in one statement (the status compared with a column of the arrays,
# as above, so that the planner looks the rows up by id).
RENEW_PG = (
    "UPDATE jobs SET lease_expires_at = %s, updated_at = %s "
    "FROM unnest(%b::text[], %b::text[], %b::text[]) AS v(id, attempt, status) "
    "WHERE jobs.id = v.id AND jobs.attempt = v.attempt AND jobs.status = v.status "
    "RETURNING jobs.id"
)
INSERT_JOB = (
    "INSERT INTO jobs (id, backend, tbl, path, payload, status, max_retries, retry_strategy, "
    "delay_ms, timeout, assigned_to, created_at, updated_at, pool, priority, slots, run_after, "
    "queue_timeout, queue_deadline, max_job_duration) "
    "VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)


# Job's fields are the columns, in order (``tbl`` is ``table``): a row maps to a Job by
# position, decoding the JSON columns; the claim's hot path builds 16 at a time.
if [field.name for field in fields(Job)] != [
    "table" if name == "tbl" else name for name in _COLUMN_NAMES
]:
    raise AssertionError("rows.COLUMNS and model.Job's fields must be in the same order")
_PAYLOAD, _ERRORS, _RESULT, _CANCEL, _ATTEMPTS = (
    _COLUMN_NAMES.index(name)
    for name in ("payload", "errors", "result", "cancel_requested", "attempts")
)


_STATUS, _ASSIGNEE, _MACHINE, _ATTEMPT, _NUMBER, _LEASE, _DEADLINE, _STARTED, _UPDATED = (
    _COLUMN_NAMES.index(name)
    for name in (
        "status", "assignee", "machine", "attempt", "attempt_number", "lease_expires_at",
        "deadline", "started_at", "updated_at",
    )
)  # fmt: skip
_FINISHED = _COLUMN_NAMES.index("finished_at")


def _history(text: str) -> tuple[Any, ...]:
    return () if text == "[]" else tuple(json.loads(text))


def _attempts(values: Sequence[Any]) -> tuple[AttemptEntry, ...]:
    """The attempt history of a row: the column's entries, then, when the column has no entry
    for the row's attempt (one the hot path started, or ended in success), that attempt's
    entry made of the row's columns, as transitions.attempt_entry and end_attempt make it."""
    stored = _history(values[_ATTEMPTS])
    attempt, number, status = values[_ATTEMPT], values[_NUMBER], values[_STATUS]
    if attempt is None:
        return stored
    last = stored[-1] if stored else None
    current: AttemptEntry
    if last is None or last.get("number", 0) < number:
        current = attempt_entry(number, attempt, values[_MACHINE], values[_STARTED])
    elif last.get("id") == attempt and last.get("ended_at") is None and status in TERMINAL:
        # Left open by a claim of a build before migration 9 (it stored the entry) and ended
        # since on the hot path, which no longer closes it: the row's end is the entry's.
        current = attempt_entry(number, attempt, last.get("machine"), last.get("started_at"))
        stored = stored[:-1]
    else:
        return stored
    if status in TERMINAL:
        current["ended_at"], current["outcome"] = values[_FINISHED], status
    return (*stored, current)


def stored_attempts(job: Job) -> tuple[AttemptEntry, ...]:
    """What the attempts column holds of ``job``'s history (``_attempts`` reads it back): all
    of it, but the entry of the attempt a running job runs, which its columns are."""
    attempts = job.attempts
    if job.status == "processing" and attempts and attempts[-1].get("id") == job.attempt:
        return attempts[:-1]
    return attempts


def _decoded(values: list[Any]) -> list[Any]:
    """A row's values with its JSON and flag columns as Job has them (in place)."""
    values[_PAYLOAD] = json.loads(values[_PAYLOAD])
    values[_ERRORS] = _history(values[_ERRORS])
    if values[_RESULT] is not None:
        values[_RESULT] = json.loads(values[_RESULT])
    values[_CANCEL] = bool(values[_CANCEL])
    values[_ATTEMPTS] = _attempts(values)
    return values


def job_from_row(row: Sequence[Any]) -> Job:
    return Job(*_decoded(list(row)))


def started_job(
    row: Sequence[Any],
    owner: str,
    machine: str | None,
    attempt: str,
    lease_expires_at: float,
    deadline: float | None,
    now: float,
) -> Job:
    """The Job START_ATTEMPTS makes of the pending ``row`` (all COLUMNS, as read before it):
    built here rather than read back, what the statement wrote field by field (the new
    attempt's entry, as ``job_from_row`` makes it of them)."""
    values = list(row)
    values[_STATUS] = "processing"
    values[_ASSIGNEE] = owner
    values[_MACHINE] = machine
    values[_ATTEMPT] = attempt
    values[_NUMBER] = values[_NUMBER] + 1
    values[_LEASE] = lease_expires_at
    values[_DEADLINE] = deadline
    values[_STARTED] = now
    values[_UPDATED] = now
    return Job(*_decoded(values))


def filters(**columns: Any) -> tuple[str, tuple[Any, ...]]:
    present = {name: value for name, value in columns.items() if value is not None}
    if not present:
        return "", ()
    return " WHERE " + " AND ".join(f"{name} = ?" for name in present), tuple(present.values())


def insert_row(new: NewJob, job_id: str, now: float) -> tuple[Any, ...]:
    run_after = now + new.delay_ms / 1000.0
    queue_deadline = None if new.queue_timeout is None else run_after + new.queue_timeout
    return (
        job_id,
        new.backend,
        new.table,
        new.path,
        json.dumps(new.payload),
        new.max_retries,
        new.retry_strategy,
        new.delay_ms,
        new.timeout,
        new.assigned_to,
        now,
        now,
        new.pool,
        new.priority,
        new.slots,
        run_after,
        new.queue_timeout,
        queue_deadline,
        new.max_job_duration,
    )


def pending_job(row: Sequence[Any]) -> Job:
    """The Job an ``insert_row`` writes with INSERT_JOB, the table's defaults for the rest,
    as ``job_from_row`` would read it back (floats where the columns are DOUBLE PRECISION,
    the payload through JSON): ``tests/store/test_store_contract.py`` holds the two equal."""
    (job_id, backend, table, path, payload, max_retries, retry_strategy, delay_ms, timeout,
     assigned_to, created_at, updated_at, pool, priority, slots, run_after, queue_timeout,
     queue_deadline, max_job_duration) = row  # fmt: skip
    return Job(
        id=job_id,
        backend=backend,
        table=table,
        path=path,
        payload=json.loads(payload),
        status="pending",
        retries=0,
        max_retries=max_retries,
        retry_strategy=retry_strategy,
        delay_ms=delay_ms,
        timeout=_real(timeout),
        errors=(),
        result=None,
        assignee=None,
        assigned_to=assigned_to,
        created_at=float(created_at),
        updated_at=float(updated_at),
        pool=pool,
        priority=priority,
        slots=slots,
        run_after=float(run_after),
        queue_timeout=_real(queue_timeout),
        queue_deadline=_real(queue_deadline),
        max_job_duration=_real(max_job_duration),
        attempt=None,
        attempt_number=0,
        machine=None,
        lease_expires_at=None,
        deadline=None,
        cancel_requested=False,
        started_at=None,
        finished_at=None,
        attempts=(),
    )


def _real(value: float | None) -> float | None:
    return None if value is None else float(value)


def insert_order(row: Sequence[Any]) -> tuple[Any, ...]:
    """An ``insert_row``'s place in admission order (QUEUE_ORDER: priority descending, then
    created_at, then id). Rows written in that order sit together in the table and in each
    index on the pending jobs, so that claiming the head of the queue and completing it
    change a few pages, not a page a job."""
    return (-row[13], row[10], row[0])


def update_row(before: Job, after: Job) -> tuple[Any, ...]:
    return (
        after.status,
        after.retries,
        json.dumps(list(after.errors)),
        None if after.result is None else json.dumps(after.result),
        after.assignee,
        after.updated_at,
        after.run_after,
        after.queue_deadline,
        after.attempt,
        after.attempt_number,
        after.machine,
        after.lease_expires_at,
        after.deadline,
        int(after.cancel_requested),
        after.started_at,
        after.finished_at,
        json.dumps(list(stored_attempts(after))),
        before.id,
        before.status,
        before.attempt,
        int(before.cancel_requested),
        before.lease_expires_at,
    )


@dataclass(frozen=True, slots=True)
class Claim:
    """A claim of the head of ``table``'s queue: the jobs that fit in ``free_slots``, started
    for ``owner`` (on ``machine``) at ``now``, each attempt leased for ``lease`` seconds;
    ``concurrency`` caps the table's jobs in flight."""

    table: str
    free_slots: int
    owner: str
    now: float
    lease: float
    machine: str | None = None
    concurrency: int | None = None


# What a SQLite claim reads of the head of the queue where it answers a poll's Started: what
# admission, the deadline and the work need.
HEAD_COLUMNS = "id, slots, timeout, max_job_duration, path, payload, run_after"


@dataclass(frozen=True, slots=True)
class Claimed(Generic[T]):
    """What a claim answers of each attempt it starts (a whole Job, or a poll's Started). On
    SQLite the claim reads ``head``'s columns of the queued rows and builds each answer with
    ``made`` (the row, the claim, the attempt id, the deadline), not read back; on PostgreSQL
    its statement (``any_pg`` without a concurrency cap, ``capped_pg`` with one) returns the
    answer's columns, which ``read`` reads."""

    head: str
    made: Callable[[Sequence[Any], Claim, str, float | None], T]
    any_pg: str
    capped_pg: str
    read: Callable[[Sequence[Any]], T]
    # where slots, timeout and max_job_duration stand in a row of ``head``
    places: tuple[int, int, int] = field(init=False)

    def __post_init__(self) -> None:
        names = self.head.replace(" ", "").split(",")
        places = tuple(names.index(name) for name in ("slots", "timeout", "max_job_duration"))
        object.__setattr__(self, "places", places)


def started_from_row(row: Sequence[Any]) -> Started:
    """A Started of a claim's row (STARTED_COLUMNS)."""
    job_id, attempt, path, payload, deadline, lease_expires_at, run_after = row
    return Started(
        job_id, attempt, path, json.loads(payload), deadline, lease_expires_at, run_after
    )


def _made_job(row: Sequence[Any], claim: Claim, attempt: str, deadline: float | None) -> Job:
    return started_job(
        row, claim.owner, claim.machine, attempt, claim.now + claim.lease, deadline, claim.now
    )


_PATH, _PAYLOAD_AT, _RUN_AFTER = (
    HEAD_COLUMNS.replace(" ", "").split(",").index(name)
    for name in ("path", "payload", "run_after")
)


def _made_started(
    row: Sequence[Any], claim: Claim, attempt: str, deadline: float | None
) -> Started:
    return Started(
        row[0],
        attempt,
        row[_PATH],
        json.loads(row[_PAYLOAD_AT]),
        deadline,
        claim.now + claim.lease,
        row[_RUN_AFTER],
    )


WHOLE_JOBS: Claimed[Job] = Claimed(COLUMNS, _made_job, CLAIM_ANY_PG, CLAIM_CAPPED_PG, job_from_row)
STARTED: Claimed[Started] = Claimed(
    HEAD_COLUMNS, _made_started, CLAIM_ANY_STARTED_PG, CLAIM_CAPPED_STARTED_PG, started_from_row
)
