"""Jobs on the dialect core: enqueue, claim, lease, report, kill, retry, and the reads.

Every status change is a compare-and-set on (status, attempt) inside one transaction, so kill,
retry, recovery and the runner can never leave a job in states they disagree about.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from sp00ky_infra.policy.jobs import admission_key
from sp00ky_infra.store.dialect import Dialect, Later, Sql
from sp00ky_infra.store.model import (
    CANCELLED,
    STATUSES,
    TERMINAL,
    Conflict,
    ErrorEntry,
    Job,
    JobNotFound,
    JobStatus,
    NewJob,
    QueueFull,
    Recorded,
    Running,
    StaleAttempt,
    Started,
)
from sp00ky_infra.store.rows import (
    COLUMNS,
    INSERT_JOB,
    QUEUE_ORDER,
    STARTED,
    UPDATE_JOB,
    WHOLE_JOBS,
    Claim,
    Claimed,
    filters,
    insert_order,
    insert_row,
    job_from_row,
    pending_job,
    update_row,
)
from sp00ky_infra.store.transitions import (
    after_failure,
    error_entry,
    finish,
    new_job_id,
    rerun,
    validate_new,
)

CAS_TRIES = 5
RETRY_LATER = "try again later, or raise pools.{pool}.maxQueued"
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One table's queue as /metrics shows it."""

    due: int  # pending and eligible now
    delayed: int  # pending, waiting for their delay or a retry's backoff
    processing: int
    oldest_due: float | None  # run_after of the longest-waiting due job


class JobTable:
    """The jobs table, on the store's connections."""

    def __init__(self, db: Dialect) -> None:
        self._db = db

    def _fetch(self, sql: Sql, job_id: str) -> Job:
        sql.execute(f"SELECT {COLUMNS} FROM jobs WHERE id = ?", (job_id,))
        row = sql.fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}; `sp00ky-infra jobs list` shows the jobs")
        return job_from_row(row)

    def _save(self, sql: Sql, before: Job, after: Job) -> bool:
        """Write ``after`` if the row is still as ``before`` left it (compare-and-set on
        status, attempt, kill request and lease); False when another writer got there first."""
        sql.execute(UPDATE_JOB, update_row(before, after))
        return bool(sql.rowcount == 1)

    def transition(self, job_id: str, change: Callable[[Job], Job | None]) -> Job:
        """Read the row, compute its next state with ``change`` (pure; it may raise, or return
        None to leave the row as it is) and write it with one compare-and-set; on a lost race,
        read again. Each write is its own transaction: one round trip, one commit."""
        for _ in range(CAS_TRIES):
            with self._db.read() as sql:
                before = self._fetch(sql, job_id)
                after = change(before)
                if after is None:
                    return before
                if self._save(sql, before, after):
                    # Watchers wait for work or a kill to deliver; an ended job frees a slot
                    # whose machine the controller wakes itself. Notifying only then keeps a
                    # completion to one round trip on PostgreSQL.
                    requeued = after.status == "pending" and before.status != "pending"
                    if requeued or (after.cancel_requested and not before.cancel_requested):
                        sql.changed()
                    return after
        raise Conflict(f"{job_id} kept changing while it was being updated; try again")

    # --- writing jobs --------------------------------------------------------------------------

    def enqueue(self, new: NewJob, now: float, max_queued: int | None = None) -> Job:
        """Write a pending row. Refuses with QueueFull past the pool's ``max_queued``. The
        Job as written (rows.pending_job: built from the row, not read back)."""
        (row,) = self._insert([new], now, max_queued)
        return pending_job(row)

    def enqueue_many(
        self, news: Sequence[NewJob], now: float, max_queued: int | None = None
    ) -> list[str]:
        """Write pending rows in one transaction (a fan-out); returns their ids in order.

        ``max_queued`` caps the waiting jobs of each pool the rows name: if any pool would go
        past it, nothing is written and QueueFull says which.
        """
        return [row[0] for row in self._insert(news, now, max_queued)]

    def _insert(
        self, news: Sequence[NewJob], now: float, max_queued: int | None
    ) -> list[tuple[Any, ...]]:
        """``enqueue_many``: the rows written (rows.insert_row's), in the order given."""
        for new in news:
            validate_new(new)
        rows = [insert_row(new, new_job_id(new.table), now) for new in news]
        with self._db.write() as sql:
            if max_queued is not None:
                adding: dict[tuple[str, str], int] = {}
                for new in news:
                    if new.pool is not None:
                        key = (new.pool, new.table)
                        adding[key] = adding.get(key, 0) + 1
                for (pool, table), count in sorted(adding.items()):
                    check_room(sql, pool, table, count, max_queued, RETRY_LATER.format(pool=pool))
            # Written in admission order (rows.insert_order): a fan-out's rows share
            # created_at and its ids are random, so in the order given they would be claimed
            # from all over the table and its indexes, a page written a job.
            sql.executemany(INSERT_JOB, sorted(rows, key=insert_order))
            # Delayed rows come due later: the controller looks for those every few moments
            sql.changed(due=[new.table for new in news if new.delay_ms <= 0])
        return rows

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
        return self.send_claim(
            table, free_slots, owner, now, lease, machine=machine, concurrency=concurrency
        ).result()

    def send_claim(
        self,
        table: str,
        free_slots: int,
        owner: str,
        now: float,
        lease: float,
        machine: str | None = None,
        concurrency: int | None = None,
    ) -> Later[list[Job]]:
        """``claim``, sent (``Later``): inside ``transaction()`` on PostgreSQL, with what is
        sent around it, and read after the COMMIT if asked for then."""
        request = Claim(table, free_slots, owner, now, lease, machine, concurrency)
        return self._claim(request, WHOLE_JOBS)

    def send_start(
        self,
        table: str,
        free_slots: int,
        owner: str,
        now: float,
        lease: float,
        machine: str | None = None,
        concurrency: int | None = None,
    ) -> Later[list[Started]]:
        """``send_claim`` as a poll makes it: the same claim, each attempt it started read as
        a Started (the columns the machine's assignment needs), not as a whole Job."""
        request = Claim(table, free_slots, owner, now, lease, machine, concurrency)
        return self._claim(request, STARTED)

    def _claim(self, request: Claim, shape: Claimed[T]) -> Later[list[T]]:
        if request.free_slots < 1:
            return Later.ready([])
        return self._db.claim_head(request, shape)

    def renew(self, leases: Sequence[tuple[str, str]], now: float, lease: float) -> set[str]:
        """Extend the leases of (job id, attempt) pairs still current; returns their job ids."""
        return self.send_renew(leases, now, lease).result()

    def send_renew(
        self, leases: Sequence[tuple[str, str]], now: float, lease: float
    ) -> Later[set[str]]:
        """``renew``, sent (``Later``)."""
        if not leases:
            return Later.ready(set())
        return self._db.renew_leases(leases, now, lease)

    def complete(self, job_id: str, attempt: str, result: Any, now: float) -> Job:
        """Record the backend's answer for the current attempt: success.

        A job killed while it ran fails with ``cancelled`` instead; the late answer is kept
        on its error entry. A result for an attempt that is not current raises StaleAttempt.
        (``complete_many`` of one result, then the job as it is now.)
        """
        (done,) = self.complete_many([(job_id, attempt, result)], now)
        if done.refused is not None:
            raise done.refused
        return self.get(job_id)

    def complete_many(
        self,
        results: Sequence[tuple[str, str, Any]],
        now: float,
        machine: str | None = None,
    ) -> list[Recorded]:
        """Record the backends' answers, as (job id, attempt, result), each for its current
        attempt: what ``complete`` does for each, in one statement per batch (on SQLite per
        chunk of START_ROWS_MAX) for the common case, a running job nobody killed.

        ``machine``: the machine that reports them; a result for an attempt that runs on
        another machine is refused (Conflict). Each result is recorded or refused on its own:
        the outcomes come back in order, a refused one with ``refused`` set, never raised.
        Call it inside ``transaction()`` to commit the batch with the rest of a poll.
        """
        return self.send_complete_many(results, now, machine).result()

    def send_complete_many(
        self,
        results: Sequence[tuple[str, str, Any]],
        now: float,
        machine: str | None = None,
    ) -> Later[list[Recorded]]:
        """``complete_many``, sent (``Later``): the common case's statement goes with what is
        sent around it; the others' transitions run when the outcome is asked for."""
        if not results:
            return Later.ready([])
        # The results as their column holds them (JSON), a job's first one only: a join with
        # two rows for one job would update it with either, and a later one must be stale.
        firsts: dict[str, tuple[str, str, str | None]] = {}
        for job_id, attempt, result in results:
            if job_id not in firsts:
                payload = None if result is None else json.dumps(result)
                firsts[job_id] = (job_id, attempt, payload)

        def recorded(started: dict[str, float | None]) -> list[Recorded]:
            outcomes = []
            for job_id, attempt, result in results:
                if job_id in started:  # once: the same result twice is stale the second time
                    outcomes.append(Recorded(job_id, attempt, "success", "", started.pop(job_id)))
                else:
                    outcomes.append(self._complete_slow(job_id, attempt, result, now, machine))
            return outcomes

        return self._db.end_attempts(list(firsts.values()), now, machine).then(recorded)

    def _complete_slow(
        self, job_id: str, attempt: str, result: Any, now: float, machine: str | None
    ) -> Recorded:
        """A result the common case did not take: killed, stale, unknown, another machine's."""

        def change(job: Job) -> Job:
            _require_current(job, attempt)
            if machine is not None and job.machine != machine:
                raise Conflict(f"attempt {attempt} of {job_id} is not machine {machine}'s")
            if job.cancel_requested:
                reason = "killed while it ran; its answer came later"
                cancelled = error_entry(CANCELLED, reason, job, now)
                return finish(job, "failed", now, error=cancelled, late_result=result)
            return finish(job, "success", now, result=result)

        try:
            job = self.transition(job_id, change)
        except (Conflict, JobNotFound) as exc:
            return Recorded(job_id, attempt, refused=exc)
        code = str(job.errors[-1].get("code", "")) if job.errors else ""
        return Recorded(job_id, attempt, job.status, code, job.started_at)

    def fail_attempt(
        self, job_id: str, attempt: str, error: ErrorEntry, now: float, retryable: bool = True
    ) -> Job:
        """The current attempt failed: retry with backoff while retries remain, else fail."""

        def change(job: Job) -> Job:
            _require_current(job, attempt)
            return after_failure(job, error, now, retryable)

        return self.transition(job_id, change)

    def confirm_cancel(self, job_id: str, attempt: str, now: float) -> Job:
        """The machine dropped a killed job's request: the job fails with ``cancelled``."""

        def change(job: Job) -> Job:
            _require_current(job, attempt)
            if not job.cancel_requested:
                raise Conflict(f"{job_id} was not killed; nothing to confirm")
            return finish(
                job, "failed", now, error=error_entry(CANCELLED, "killed while it ran", job, now)
            )

        return self.transition(job_id, change)

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

        return self.transition(job_id, change)

    def retry(self, job_id: str, now: float) -> Job:
        """Run a finished job again as a new attempt; its errors and attempts stay."""

        def change(job: Job) -> Job:
            if job.status not in TERMINAL:
                raise Conflict(
                    f"{job_id} is still {job.status}; only a finished job can be retried "
                    "(kill it first)"
                )
            return rerun(job, now)

        return self.transition(job_id, change)

    def cancel_waiting(
        self, backend: str, table: str, pool: str, reason: str, now: float, batch: int
    ) -> list[str]:
        """Up to ``batch`` waiting jobs of (backend, table, pool) fail with ``cancelled`` and
        ``reason``; the ids. Each is its own compare-and-set: one claimed meanwhile runs on."""
        with self._db.read() as sql:
            sql.execute(
                "SELECT id FROM jobs WHERE tbl = ? AND status = 'pending' AND backend = ? "
                "AND pool = ? LIMIT ?",
                (table, backend, pool, batch),
            )
            listed = [row[0] for row in sql.fetchall()]

        cancelled: dict[str, bool] = {}  # the last verdict: a lost compare-and-set asks again

        def change(job: Job) -> Job | None:
            cancelled[job.id] = job.status == "pending"  # else claimed, killed or timed out
            if not cancelled[job.id]:
                return None
            error = error_entry(CANCELLED, f"{reason}; cancelled while waiting", job, now)
            return finish(job, "failed", now, error=error)

        for job_id in listed:
            with contextlib.suppress(JobNotFound):  # pruned meanwhile
                self.transition(job_id, change)
        return [job_id for job_id, done in cancelled.items() if done]

    # --- reading -------------------------------------------------------------------------------

    def get(self, job_id: str) -> Job:
        with self._db.read() as sql:
            return self._fetch(sql, job_id)

    def list_jobs(
        self,
        status: JobStatus | None = None,
        limit: int = 100,
        table: str | None = None,
        pool: str | None = None,
    ) -> list[Job]:
        """Jobs, newest first."""
        where, params = filters(status=status, tbl=table, pool=pool)
        with self._db.read() as sql:
            sql.execute(
                f"SELECT {COLUMNS} FROM jobs{where} ORDER BY created_at DESC, id DESC LIMIT ?",
                (*params, limit),
            )
            return [job_from_row(row) for row in sql.fetchall()]

    def queue(self, table: str, now: float, limit: int = 100) -> list[Job]:
        """Eligible pending jobs of ``table`` in admission order: the head of jobs_queue,
        read in its order (``+run_after``, as the claim has it: SQLite would rather take
        jobs_pending_due's range and sort every due row). Delayed jobs that outrank the due
        ones are stepped over one by one, as the claim steps over them."""
        with self._db.read() as sql:
            sql.execute(
                f"SELECT {COLUMNS} FROM jobs WHERE tbl = ? AND status = 'pending' "
                f"AND +run_after <= ? ORDER BY {QUEUE_ORDER} LIMIT ?",
                (table, now, limit),
            )
            return [job_from_row(row) for row in sql.fetchall()]

    def delayed(self, table: str, now: float, limit: int = 100) -> list[Job]:
        """The ``limit`` pending jobs of ``table`` due soonest that are not due yet (a
        delay, a retry's backoff), in the order they will be: by due time, then admission
        order. Read in jobs_pending_due's order, which stops at ``limit``; of jobs due at
        the same moment across the cut, which ones come is left to the index (an order by
        priority there too sorted every one of them: a batch enqueued with one delay is due
        at one moment)."""
        with self._db.read() as sql:
            sql.execute(
                f"SELECT {COLUMNS} FROM jobs WHERE tbl = ? AND status = 'pending' "
                "AND run_after > ? ORDER BY run_after LIMIT ?",
                (table, now, limit),
            )
            found = [job_from_row(row) for row in sql.fetchall()]
        found.sort(
            key=lambda job: (job.run_after, *admission_key(job.priority, job.created_at, job.id))
        )
        return found

    def waiting_routes(self) -> list[tuple[str, str, str]]:
        """Each (backend, table, pool) that pooled jobs wait under: read off jobs_pending_due."""
        with self._db.read() as sql:
            sql.execute(
                "SELECT DISTINCT backend, tbl, pool FROM jobs WHERE status = 'pending' "
                "AND pool IS NOT NULL"
            )
            return [(row[0], row[1], row[2]) for row in sql.fetchall()]

    def counts(self, table: str | None = None, pool: str | None = None) -> dict[str, int]:
        """Jobs by status (every status present, zero or not). One table's: each status a
        range of jobs_finished (status, tbl, ...), found by the IN list; without it SQLite
        would read the whole index for one table (and the admin API's /pools counts every
        pool's). A pool's are read whole either way: no index leads with it."""
        where, params = filters(tbl=table, pool=pool)
        if where:
            where += f" AND status IN ({', '.join(repr(status) for status in STATUSES)})"
        with self._db.read() as sql:
            sql.execute(f"SELECT status, count(*) FROM jobs{where} GROUP BY status", params)
            found = {row[0]: int(row[1]) for row in sql.fetchall()}
        return {status: found.get(status, 0) for status in STATUSES}

    def queued(self, table: str, now: float, cap: int) -> int:
        """Eligible pending jobs of ``table``, counted up to ``cap`` (cost flat in the backlog)."""
        with self._db.read() as sql:
            sql.execute(
                "SELECT count(*) FROM (SELECT 1 FROM jobs WHERE tbl = ? AND status = 'pending' "
                "AND run_after <= ? LIMIT ?) AS head",
                (table, now, cap),
            )
            return int(sql.fetchone()[0])

    def queued_slots(self, table: str, now: float, cap: int) -> int:
        """The slots eligible pending jobs of ``table`` need (a job needing 2 slots counts 2),
        over the first ``cap`` of them in queue order: every job needs a slot at least, so
        ``cap`` jobs already need ``cap`` slots and the cost stays flat in the backlog."""
        with self._db.read() as sql:
            sql.execute(
                "SELECT coalesce(sum(slots), 0) FROM (SELECT slots FROM jobs WHERE tbl = ? "
                "AND status = 'pending' AND run_after <= ? LIMIT ?) AS head",
                (table, now, cap),
            )
            return int(sql.fetchone()[0])

    def queue_stats(self, table: str, now: float) -> QueueStats:
        """Pending jobs of ``table`` due and delayed, the due time of the oldest due one, and
        the jobs running: two ranges of the jobs_pending_due index (no row is read; a range
        on run_after, so that SQLite picks that index over jobs_queue) and the running rows."""
        with self._db.scan() as sql:
            sql.execute(
                "SELECT count(*), min(run_after) FROM jobs WHERE tbl = ? AND status = 'pending' "
                "AND run_after <= ?",
                (table, now),
            )
            due, oldest = sql.fetchone()
            sql.execute(
                "SELECT count(*) FROM jobs WHERE tbl = ? AND status = 'pending' AND run_after > ?",
                (table, now),
            )
            delayed = sql.fetchone()[0]
            sql.execute(
                "SELECT count(*) FROM jobs WHERE tbl = ? AND status = 'processing'", (table,)
            )
            running = sql.fetchone()[0]
        return QueueStats(int(due), int(delayed), int(running), oldest)

    def ahead_of(self, job: Job, now: float) -> int:
        """Due pending jobs before ``job`` in admission order (policy.jobs.admission_key):
        a range of the jobs_queue index."""
        with self._db.scan() as sql:
            sql.execute(
                "SELECT count(*) FROM jobs WHERE tbl = ? AND status = 'pending' "
                "AND run_after <= ? AND id <> ? AND (priority > ? OR (priority = ? AND "
                "(created_at < ? OR (created_at = ? AND id < ?))))",
                (job.table, now, job.id, job.priority, job.priority, job.created_at,
                 job.created_at, job.id),
            )  # fmt: skip
            return int(sql.fetchone()[0])

    def busy_slots(self, table: str) -> dict[str, int]:
        """Slots taken by running jobs of ``table``, by machine."""
        with self._db.read() as sql:
            sql.execute(
                "SELECT machine, sum(slots) FROM jobs WHERE tbl = ? AND status = 'processing' "
                "GROUP BY machine",
                (table,),
            )
            return {row[0]: int(row[1]) for row in sql.fetchall() if row[0] is not None}

    def running_on(self, machine: str) -> list[Job]:
        """The jobs whose current attempt runs on ``machine``."""
        return self.send_running_on(machine).result()

    def send_running_on(self, machine: str) -> Later[list[Job]]:
        """``running_on``, sent (``Later``)."""
        rows = self._db.send(
            f"SELECT {COLUMNS} FROM jobs WHERE status = 'processing' AND machine = ? "
            "ORDER BY started_at, id",
            (machine,),
        )
        return rows.then(lambda rows: [job_from_row(row) for row in rows])

    def send_running(self, machine: str) -> Later[list[Running]]:
        """The jobs whose current attempt runs on ``machine``, as a poll needs them (Running:
        five columns, not the whole row and its JSON; sent as ``send_running_on``)."""
        rows = self._db.send(
            "SELECT id, attempt, slots, cancel_requested, started_at FROM jobs "
            "WHERE status = 'processing' AND machine = ? ORDER BY started_at, id",
            (machine,),
        )
        return rows.then(
            lambda rows: [
                Running(row[0], row[1], int(row[2]), bool(row[3]), row[4]) for row in rows
            ]
        )

    def cancelling_machines(self) -> set[str]:
        """Machines that run a killed job (the kill waits for their next poll)."""
        with self._db.read() as sql:
            sql.execute(
                "SELECT DISTINCT machine FROM jobs WHERE status = 'processing' "
                "AND cancel_requested = 1",
            )
            return {row[0] for row in sql.fetchall() if row[0] is not None}


def queued_in(sql: Sql, pool: str, table: str) -> int:
    """The jobs waiting in ``pool``'s queue, its key held to the end of the transaction so
    that every writer counts what the ones before it wrote."""
    # A pool runs one backend with one outbox table, so the table's queue is the pool's.
    sql.lock(f"enqueue:{pool}")
    sql.execute("SELECT count(*) FROM jobs WHERE tbl = ? AND status = 'pending'", (table,))
    return int(sql.fetchone()[0])


def check_room(sql: Sql, pool: str, table: str, adding: int, max_queued: int, then: str) -> None:
    """Refuse (QueueFull, telling the caller ``then``) ``adding`` jobs to ``pool``'s queue
    past ``max_queued`` waiting. The pool's key is held to the end of the transaction, so
    that every writer counts what the ones before it wrote."""
    waiting = queued_in(sql, pool, table)
    if waiting + adding > max_queued:
        raise QueueFull(
            f"pool {pool!r} already has {waiting} jobs waiting (maxQueued {max_queued}); {then}"
        )


def _require_current(job: Job, attempt: str) -> None:
    if job.status != "processing" or job.attempt != attempt:
        state = (
            f"the job is on attempt {job.attempt} now"
            if job.status == "processing"
            else f"the job is {job.status}"
        )
        raise StaleAttempt(f"attempt {attempt} of {job.id} is no longer current ({state})")
