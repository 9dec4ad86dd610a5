"""The job store in SQL, written once for SQLite and PostgreSQL.

Every status change is a compare-and-set on (status, attempt) inside one transaction, so kill,
retry, recovery and the runner can never leave a job in states they disagree about. Its
connections, transactions and locking are the dialect core's (``dialect.py``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sp00ky_infra.policy.jobs import Queued, admit
from sp00ky_infra.store.dialect import DEFAULT_BATCH, Cursor, Dialect
from sp00ky_infra.store.machines import MachineTable, PoolTable
from sp00ky_infra.store.model import (
    CANCELLED,
    LEASE_EXPIRED,
    QUEUE_TIMEOUT,
    STATUSES,
    TERMINAL,
    TIMEOUT,
    Conflict,
    ErrorEntry,
    Job,
    JobNotFound,
    JobStatus,
    NewJob,
    QueueFull,
    StaleAttempt,
)
from sp00ky_infra.store.transitions import (
    after_failure,
    error_entry,
    finish,
    new_job_id,
    overdue,
    rerun,
    start_attempt,
    validate_new,
)

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
INSERT_JOB = (
    "INSERT INTO jobs (id, backend, tbl, path, payload, status, max_retries, retry_strategy, "
    "delay_ms, timeout, assigned_to, created_at, updated_at, pool, priority, slots, run_after, "
    "queue_timeout, queue_deadline, max_job_duration) "
    "VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
CAS_TRIES = 5


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one recovery sweep changed: job ids by reason."""

    lease_expired: tuple[str, ...] = ()
    timed_out: tuple[str, ...] = ()
    queue_timed_out: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return len(self.lease_expired) + len(self.timed_out) + len(self.queue_timed_out)


@dataclass(frozen=True, slots=True)
class PruneReport:
    """Rows deleted by retention, by outcome, all folded into the hourly counters first."""

    deleted: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.deleted.values())


@dataclass(frozen=True, slots=True)
class Counter:
    table: str
    hour: int  # unix time of the hour's start
    outcome: str
    count: int


def _hour(at: float) -> int:
    return int(at // 3600) * 3600


class SqlStore(Dialect):
    """Job rows on a SQL database. Subclasses supply the dialect."""

    @functools.cached_property
    def machines(self) -> MachineTable:
        return MachineTable(self)

    @functools.cached_property
    def pools(self) -> PoolTable:
        return PoolTable(self)

    # --- rows --------------------------------------------------------------------------------

    def _job(self, row: Sequence[Any]) -> Job:
        values = dict(zip(_COLUMN_NAMES, row, strict=True))
        return Job(
            id=values["id"],
            backend=values["backend"],
            table=values["tbl"],
            path=values["path"],
            payload=json.loads(values["payload"]),
            status=values["status"],
            retries=values["retries"],
            max_retries=values["max_retries"],
            retry_strategy=values["retry_strategy"],
            delay_ms=values["delay_ms"],
            timeout=values["timeout"],
            errors=tuple(json.loads(values["errors"])),
            result=None if values["result"] is None else json.loads(values["result"]),
            assignee=values["assignee"],
            assigned_to=values["assigned_to"],
            created_at=values["created_at"],
            updated_at=values["updated_at"],
            pool=values["pool"],
            priority=values["priority"],
            slots=values["slots"],
            run_after=values["run_after"],
            queue_timeout=values["queue_timeout"],
            queue_deadline=values["queue_deadline"],
            max_job_duration=values["max_job_duration"],
            attempt=values["attempt"],
            attempt_number=values["attempt_number"],
            machine=values["machine"],
            lease_expires_at=values["lease_expires_at"],
            deadline=values["deadline"],
            cancel_requested=bool(values["cancel_requested"]),
            started_at=values["started_at"],
            finished_at=values["finished_at"],
            attempts=tuple(json.loads(values["attempts"])),
        )

    def _fetch(self, cur: Cursor, job_id: str) -> Job:
        self._x(cur, f"SELECT {COLUMNS} FROM jobs WHERE id = ?", (job_id,))
        row = cur.fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}; `sp00ky-infra jobs list` shows the jobs")
        return self._job(row)

    def _save(self, cur: Cursor, before: Job, after: Job) -> bool:
        """Write ``after`` if the row is still as ``before`` left it (compare-and-set on
        status, attempt, kill request and lease); False when another writer got there first."""
        self._x(cur, UPDATE_JOB, _update_row(before, after))
        return bool(cur.rowcount == 1)

    def _transition(self, job_id: str, change: Callable[[Job], Job | None]) -> Job:
        """Read the row, compute its next state with ``change`` (pure; it may raise, or return
        None to leave the row as it is) and write it with one compare-and-set; on a lost race,
        read again. Each write is its own transaction: one round trip, one commit."""
        for _ in range(CAS_TRIES):
            with self._cursor() as cur:
                before = self._fetch(cur, job_id)
                after = change(before)
                if after is None:
                    return before
                if self._save(cur, before, after):
                    # Watchers wait for work or a kill to deliver; an ended job frees a slot
                    # whose machine the controller wakes itself. Notifying only then keeps a
                    # completion to one round trip on PostgreSQL.
                    requeued = after.status == "pending" and before.status != "pending"
                    if requeued or (after.cancel_requested and not before.cancel_requested):
                        self._changed(cur)
                    return after
        raise Conflict(f"{job_id} kept changing while it was being updated; try again")

    # --- writing jobs --------------------------------------------------------------------------

    def enqueue(self, new: NewJob, now: float, max_queued: int | None = None) -> Job:
        """Write a pending row. Refuses with QueueFull past the pool's ``max_queued``."""
        (job_id,) = self.enqueue_many([new], now, max_queued)
        return self.get(job_id)

    def enqueue_many(
        self, news: Sequence[NewJob], now: float, max_queued: int | None = None
    ) -> list[str]:
        """Write pending rows in one transaction (a fan-out); returns their ids in order.

        ``max_queued`` caps the waiting jobs of each pool the rows name: if any pool would go
        past it, nothing is written and QueueFull says which.
        """
        for new in news:
            validate_new(new)
        rows = [_insert_row(new, new_job_id(new.table), now) for new in news]
        with self._write() as cur:
            if max_queued is not None:
                adding: dict[tuple[str, str], int] = {}
                for new in news:
                    if new.pool is not None:
                        key = (new.pool, new.table)
                        adding[key] = adding.get(key, 0) + 1
                for (pool, table), count in sorted(adding.items()):
                    self._check_room(cur, pool, table, count, max_queued)
            cur.executemany(self._sql(INSERT_JOB), rows)
            self._changed(cur)
        return [row[0] for row in rows]

    def _check_room(self, cur: Cursor, pool: str, table: str, adding: int, max_queued: int) -> None:
        # A pool runs one backend with one outbox table, so the table's queue is the pool's.
        self._lock(cur, f"enqueue:{pool}")
        self._x(cur, "SELECT count(*) FROM jobs WHERE tbl = ? AND status = 'pending'", (table,))
        waiting = int(cur.fetchone()[0])
        if waiting + adding > max_queued:
            raise QueueFull(
                f"pool {pool!r} already has {waiting} jobs waiting (maxQueued {max_queued}); "
                f"try again later, or raise pools.{pool}.maxQueued"
            )

    def claim(
        self,
        table: str,
        free_slots: int,
        owner: str,
        now: float,
        lease: float,
        machine: str | None = None,
        concurrency: int | None = None,
    ) -> list[Job]:
        """Start the jobs at the head of ``table``'s queue that fit in ``free_slots``.

        Admission order is priority, then created_at, then id; the head waits until all the
        slots it needs are free and nothing behind it overtakes it; ``concurrency`` caps the
        table's jobs in flight. Each started job gets a new attempt id and a lease.
        """
        if free_slots < 1:
            return []
        with self._write() as cur:
            self._lock_queue(cur, table)
            in_flight = 0
            if concurrency is not None:
                self._x(
                    cur,
                    "SELECT count(*) FROM jobs WHERE tbl = ? AND status = 'processing'",
                    (table,),
                )
                in_flight = int(cur.fetchone()[0])
            self._x(
                cur,
                f"SELECT {COLUMNS} FROM jobs WHERE tbl = ? AND status = 'pending' "
                "AND run_after <= ? AND (queue_deadline IS NULL OR queue_deadline > ?) "
                f"ORDER BY {QUEUE_ORDER} LIMIT ?{self.skip_locked}",
                (table, now, now, free_slots),
            )
            queue = [self._job(row) for row in cur.fetchall()]
            chosen = set(
                admit(
                    (Queued(job.id, job.slots) for job in queue), free_slots, in_flight, concurrency
                )
            )
            pairs = [
                (job, start_attempt(job, owner, machine, now, lease))
                for job in queue
                if job.id in chosen
            ]
            if pairs:  # rows locked (PostgreSQL) or the database held (SQLite): CAS must hold
                cur.executemany(self._sql(UPDATE_JOB), [_update_row(*pair) for pair in pairs])
                if cur.rowcount != len(pairs):
                    raise Conflict(f"claim of {table} raced another writer; try again")
        return [after for _, after in pairs]

    def renew(self, leases: Sequence[tuple[str, str]], now: float, lease: float) -> set[str]:
        """Extend the leases of (job id, attempt) pairs still current; returns their job ids."""
        renewed: set[str] = set()
        if not leases:
            return renewed
        with self._write() as cur:
            for job_id, attempt in leases:
                self._x(
                    cur,
                    "UPDATE jobs SET lease_expires_at = ?, updated_at = ? "
                    "WHERE id = ? AND attempt = ? AND status = 'processing'",
                    (now + lease, now, job_id, attempt),
                )
                if cur.rowcount == 1:
                    renewed.add(job_id)
        return renewed

    def complete(self, job_id: str, attempt: str, result: Any, now: float) -> Job:
        """Record the backend's answer for the current attempt: success.

        A job killed while it ran fails with ``cancelled`` instead; the late answer is kept
        on its error entry. A result for an attempt that is not current raises StaleAttempt.
        """

        def change(job: Job) -> Job:
            _require_current(job, attempt)
            if job.cancel_requested:
                reason = "killed while it ran; its answer came later"
                cancelled = error_entry(CANCELLED, reason, job, now)
                return finish(job, "failed", now, error=cancelled, late_result=result)
            return finish(job, "success", now, result=result)

        return self._transition(job_id, change)

    def fail_attempt(
        self, job_id: str, attempt: str, error: ErrorEntry, now: float, retryable: bool = True
    ) -> Job:
        """The current attempt failed: retry with backoff while retries remain, else fail."""

        def change(job: Job) -> Job:
            _require_current(job, attempt)
            return after_failure(job, error, now, retryable)

        return self._transition(job_id, change)

    def confirm_cancel(self, job_id: str, attempt: str, now: float) -> Job:
        """The machine dropped a killed job's request: the job fails with ``cancelled``."""

        def change(job: Job) -> Job:
            _require_current(job, attempt)
            if not job.cancel_requested:
                raise Conflict(f"{job_id} was not killed; nothing to confirm")
            return finish(
                job, "failed", now, error=error_entry(CANCELLED, "killed while it ran", job, now)
            )

        return self._transition(job_id, change)

    def kill(self, job_id: str, now: float) -> Job:
        """A pending job fails at once with ``cancelled``; a running one is marked for
        cancellation, which the controller delivers to its machine."""

        def change(job: Job) -> Job | None:
            if job.status == "pending":
                cancelled = error_entry(CANCELLED, "killed while waiting", job, now)
                return finish(job, "failed", now, error=cancelled)
            if job.status == "processing":
                return (
                    None
                    if job.cancel_requested
                    else replace(job, cancel_requested=True, updated_at=now)
                )
            raise Conflict(f"{job_id} already ended ({job.status}); nothing to kill")

        return self._transition(job_id, change)

    def retry(self, job_id: str, now: float) -> Job:
        """Run a finished job again as a new attempt; its errors and attempts stay."""

        def change(job: Job) -> Job:
            if job.status not in TERMINAL:
                raise Conflict(
                    f"{job_id} is still {job.status}; only a finished job can be retried "
                    "(kill it first)"
                )
            return rerun(job, now)

        return self._transition(job_id, change)

    # --- recovery ------------------------------------------------------------------------------

    def sweep(self, now: float, batch: int = DEFAULT_BATCH) -> SweepReport:
        """Expire leases, time out attempts past their deadline, fail jobs past their queue
        deadline. Each change is its own compare-and-set, so a renewal or report that lands
        between the read and the write wins and the job is left alone."""
        with self._cursor() as cur:
            self._x(
                cur,
                "SELECT id FROM jobs WHERE status = 'processing' "
                "AND (lease_expires_at < ? OR deadline < ?) LIMIT ?",
                (now, now, batch),
            )
            running = [row[0] for row in cur.fetchall()]
            self._x(
                cur,
                "SELECT id FROM jobs WHERE status = 'pending' AND queue_deadline IS NOT NULL "
                "AND queue_deadline < ? LIMIT ?",
                (now, batch),
            )
            waiting = [row[0] for row in cur.fetchall()]
        changed: dict[str, list[str]] = {LEASE_EXPIRED: [], TIMEOUT: [], QUEUE_TIMEOUT: []}
        for job_id in running + waiting:
            code = self._sweep_one(job_id, now)
            if code is not None:
                changed[code].append(job_id)
        return SweepReport(
            tuple(changed[LEASE_EXPIRED]), tuple(changed[TIMEOUT]), tuple(changed[QUEUE_TIMEOUT])
        )

    def _sweep_one(self, job_id: str, now: float) -> str | None:
        """Apply the sweep's verdict to one job; the error code written, or None."""
        verdict: list[str] = []

        def change(job: Job) -> Job | None:
            verdict.clear()
            found = overdue(job, now)
            if found is None:
                return None  # renewed, reported or started since it was listed
            verdict.append(found[0])
            return found[1]

        try:
            self._transition(job_id, change)
        except JobNotFound:
            return None  # cleared meanwhile
        return verdict[0] if verdict else None

    # --- reading -------------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        with self._cursor() as cur:
            return self._fetch(cur, job_id)

    def list_jobs(
        self,
        status: JobStatus | None = None,
        limit: int = 100,
        table: str | None = None,
        pool: str | None = None,
    ) -> list[Job]:
        """Jobs, newest first."""
        where, params = _filters(status=status, tbl=table, pool=pool)
        with self._cursor() as cur:
            self._x(
                cur,
                f"SELECT {COLUMNS} FROM jobs{where} ORDER BY created_at DESC, id DESC LIMIT ?",
                (*params, limit),
            )
            return [self._job(row) for row in cur.fetchall()]

    def queue(self, table: str, now: float, limit: int = 100) -> list[Job]:
        """Eligible pending jobs of ``table`` in admission order."""
        with self._cursor() as cur:
            self._x(
                cur,
                f"SELECT {COLUMNS} FROM jobs WHERE tbl = ? AND status = 'pending' "
                f"AND run_after <= ? ORDER BY {QUEUE_ORDER} LIMIT ?",
                (table, now, limit),
            )
            return [self._job(row) for row in cur.fetchall()]

    def counts(self, table: str | None = None, pool: str | None = None) -> dict[str, int]:
        """Jobs by status (every status present, zero or not)."""
        where, params = _filters(tbl=table, pool=pool)
        with self._cursor() as cur:
            self._x(cur, f"SELECT status, count(*) FROM jobs{where} GROUP BY status", params)
            found = {row[0]: int(row[1]) for row in cur.fetchall()}
        return {status: found.get(status, 0) for status in STATUSES}

    def queued(self, table: str, now: float, cap: int) -> int:
        """Eligible pending jobs of ``table``, counted up to ``cap`` (cost flat in the backlog)."""
        with self._cursor() as cur:
            self._x(
                cur,
                "SELECT count(*) FROM (SELECT 1 FROM jobs WHERE tbl = ? AND status = 'pending' "
                "AND run_after <= ? LIMIT ?) AS head",
                (table, now, cap),
            )
            return int(cur.fetchone()[0])

    def busy_slots(self, table: str) -> dict[str, int]:
        """Slots taken by running jobs of ``table``, by machine."""
        with self._cursor() as cur:
            self._x(
                cur,
                "SELECT machine, sum(slots) FROM jobs WHERE tbl = ? AND status = 'processing' "
                "GROUP BY machine",
                (table,),
            )
            return {row[0]: int(row[1]) for row in cur.fetchall() if row[0] is not None}

    def running_on(self, machine: str) -> list[Job]:
        """The jobs whose current attempt runs on ``machine``."""
        with self._cursor() as cur:
            self._x(
                cur,
                f"SELECT {COLUMNS} FROM jobs WHERE status = 'processing' AND machine = ? "
                "ORDER BY started_at, id",
                (machine,),
            )
            return [self._job(row) for row in cur.fetchall()]

    def cancelling_machines(self) -> set[str]:
        """Machines that run a killed job (the kill waits for their next poll)."""
        with self._cursor() as cur:
            self._x(
                cur,
                "SELECT DISTINCT machine FROM jobs WHERE status = 'processing' "
                "AND cancel_requested = 1",
            )
            return {row[0] for row in cur.fetchall() if row[0] is not None}

    def cancels_for(self, machine: str) -> list[tuple[str, str]]:
        """(job id, attempt) of the killed jobs a machine still runs."""
        with self._cursor() as cur:
            self._x(
                cur,
                "SELECT id, attempt FROM jobs WHERE status = 'processing' AND machine = ? "
                "AND cancel_requested = 1",
                (machine,),
            )
            return [(row[0], row[1]) for row in cur.fetchall()]

    def counters(self, table: str | None = None) -> list[Counter]:
        where, params = _filters(tbl=table)
        with self._cursor() as cur:
            self._x(
                cur,
                f"SELECT tbl, hour, outcome, count FROM job_counters{where} "
                "ORDER BY tbl, hour, outcome",
                params,
            )
            return [Counter(row[0], int(row[1]), row[2], int(row[3])) for row in cur.fetchall()]

    # --- retention -----------------------------------------------------------------------------

    def prune(
        self,
        now: float,
        success_window: float,
        failed_window: float,
        max_rows: int = 0,
        batch: int = DEFAULT_BATCH,
    ) -> PruneReport:
        """Delete finished rows older than their window, and successful rows beyond
        ``max_rows`` per table (oldest first), folding each into the hourly counters first.
        Pending and processing rows are never touched."""
        deleted = {"success": 0, "failed": 0}
        for status, window in (("success", success_window), ("failed", failed_window)):
            deleted[status] += self._delete_where(
                "status = ? AND finished_at < ?", (status, now - window), batch
            )
        if max_rows > 0:
            deleted["success"] += self._trim_to(max_rows, batch)
        return PruneReport({key: value for key, value in deleted.items() if value})

    def clear(self, status: JobStatus | None = None, batch: int = DEFAULT_BATCH) -> int:
        """Delete terminal jobs (all, or those of one terminal status) in batches."""
        if status is not None and status not in TERMINAL:
            raise Conflict(f"clear deletes finished jobs only (success or failed), not {status}")
        statuses = (status,) if status else TERMINAL
        return sum(self._delete_where("status = ?", (each,), batch) for each in statuses)

    def _trim_to(self, max_rows: int, batch: int) -> int:
        with self._cursor() as cur:
            self._x(
                cur,
                "SELECT tbl, count(*) FROM jobs WHERE status = 'success' GROUP BY tbl",
            )
            over = {row[0]: int(row[1]) - max_rows for row in cur.fetchall()}
        removed = 0
        for table, excess in over.items():
            while excess > 0:
                take = min(excess, batch)
                with self._write() as cur:
                    self._x(
                        cur,
                        "SELECT id, tbl, status, finished_at FROM jobs WHERE tbl = ? "
                        "AND status = 'success' ORDER BY finished_at, id LIMIT ?",
                        (table, take),
                    )
                    rows = cur.fetchall()
                    self._fold_and_delete(cur, rows)
                removed += len(rows)
                excess -= len(rows)
                if not rows:
                    break
        return removed

    def _delete_where(self, condition: str, params: Sequence[Any], batch: int) -> int:
        removed = 0
        while True:
            with self._write() as cur:
                self._x(
                    cur,
                    f"SELECT id, tbl, status, finished_at FROM jobs WHERE {condition} LIMIT ?",
                    (*params, batch),
                )
                rows = cur.fetchall()
                self._fold_and_delete(cur, rows)
            removed += len(rows)
            if len(rows) < batch:
                return removed

    def _fold_and_delete(self, cur: Cursor, rows: Sequence[Sequence[Any]]) -> None:
        if not rows:
            return
        folded: dict[tuple[str, int, str], int] = {}
        for _, table, status, finished_at in rows:
            key = (table, _hour(finished_at or 0.0), status)
            folded[key] = folded.get(key, 0) + 1
        for (table, hour, outcome), count in folded.items():
            self._x(
                cur,
                "INSERT INTO job_counters (tbl, hour, outcome, count) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (tbl, hour, outcome) "
                "DO UPDATE SET count = job_counters.count + excluded.count",
                (table, hour, outcome, count),
            )
        for start in range(0, len(rows), 200):
            ids = [row[0] for row in rows[start : start + 200]]
            marks = ", ".join("?" for _ in ids)
            self._x(
                cur,
                f"DELETE FROM jobs WHERE id IN ({marks}) AND status IN ('success', 'failed')",
                ids,
            )


def _filters(**columns: Any) -> tuple[str, tuple[Any, ...]]:
    present = {name: value for name, value in columns.items() if value is not None}
    if not present:
        return "", ()
    return " WHERE " + " AND ".join(f"{name} = ?" for name in present), tuple(present.values())


def _insert_row(new: NewJob, job_id: str, now: float) -> tuple[Any, ...]:
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


def _update_row(before: Job, after: Job) -> tuple[Any, ...]:
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
        json.dumps(list(after.attempts)),
        before.id,
        before.status,
        before.attempt,
        int(before.cancel_requested),
        before.lease_expires_at,
    )


def _require_current(job: Job, attempt: str) -> None:
    if job.status != "processing" or job.attempt != attempt:
        state = (
            f"the job is on attempt {job.attempt} now"
            if job.status == "processing"
            else f"the job is {job.status}"
        )
        raise StaleAttempt(f"attempt {attempt} of {job.id} is no longer current ({state})")
