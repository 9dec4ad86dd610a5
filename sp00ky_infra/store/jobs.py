"""Jobs on the dialect core: enqueue, claim, lease, report, kill, retry, and the reads.

Every status change is a compare-and-set on (status, attempt) inside one transaction, so kill,
retry, recovery and the runner can never leave a job in states they disagree about.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sp00ky_infra.policy.jobs import Queued, admission_key, admit
from sp00ky_infra.store.dialect import Cursor, Dialect, Later
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
    CLAIM_ANY_PG,
    CLAIM_ANY_STARTED_PG,
    CLAIM_CAPPED_PG,
    CLAIM_CAPPED_STARTED_PG,
    COLUMNS,
    COMPLETE_ATTEMPT,
    COMPLETE_ATTEMPT_PG,
    COMPLETE_ATTEMPTS_PG,
    INSERT_JOB,
    QUEUE_ORDER,
    RENEW_PG,
    START_ROWS_MAX,
    UPDATE_JOB,
    chunks,
    complete_attempts,
    filters,
    insert_order,
    insert_row,
    job_from_row,
    pending_job,
    start_attempts,
    started_job,
    update_row,
)
from sp00ky_infra.store.transitions import (
    after_failure,
    attempt_deadline,
    error_entry,
    finish,
    new_attempt_id,
    new_job_id,
    rerun,
    validate_new,
)

CAS_TRIES = 5
# What a SQLite claim reads of the head of the queue: every column where it returns whole
# Jobs, only these where it returns a poll's Started (admission, the deadline, the work).
HEAD_COLUMNS = "id, slots, timeout, max_job_duration, path, payload, run_after"
_HEAD_FIELDS = ("slots", "timeout", "max_job_duration", "path", "payload", "run_after")


def _places(columns: str) -> tuple[int, ...]:
    """Where _HEAD_FIELDS stand in a row of ``columns``."""
    names = columns.replace(" ", "").split(",")
    return tuple(names.index(name) for name in _HEAD_FIELDS)


_WHOLE_PLACES, _HEAD_PLACES = _places(COLUMNS), _places(HEAD_COLUMNS)


@dataclass(frozen=True, slots=True)
class QueueStats:
    """One table's queue as /metrics shows it."""

    due: int  # pending and eligible now
    delayed: int  # pending, waiting for their delay or a retry's backoff
    processing: int
    oldest_due: float | None  # run_after of the longest-waiting due job


class Jobs(Dialect):
    """The jobs table, written and read through the store's own connections."""

    def _fetch(self, cur: Cursor, job_id: str) -> Job:
        self._x(cur, f"SELECT {COLUMNS} FROM jobs WHERE id = ?", (job_id,))
        row = cur.fetchone()
        if row is None:
            raise JobNotFound(f"no job {job_id!r}; `sp00ky-infra jobs list` shows the jobs")
        return job_from_row(row)

    def _save(self, cur: Cursor, before: Job, after: Job) -> bool:
        """Write ``after`` if the row is still as ``before`` left it (compare-and-set on
        status, attempt, kill request and lease); False when another writer got there first."""
        self._x(cur, UPDATE_JOB, update_row(before, after))
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
        with self._write() as cur:
            if max_queued is not None:
                adding: dict[tuple[str, str], int] = {}
                for new in news:
                    if new.pool is not None:
                        key = (new.pool, new.table)
                        adding[key] = adding.get(key, 0) + 1
                for (pool, table), count in sorted(adding.items()):
                    self._check_room(cur, pool, table, count, max_queued)
            # Written in admission order (rows.insert_order): a fan-out's rows share
            # created_at and its ids are random, so in the order given they would be claimed
            # from all over the table and its indexes (measured on SQLite: 90 pages written a
            # poll of 16 results and 16 claims, against 15 in admission order).
            cur.executemany(self._sql(INSERT_JOB), sorted(rows, key=insert_order))
            # Delayed rows come due later: the controller looks for those every few moments
            self._changed(cur, due=[new.table for new in news if new.delay_ms <= 0])
        return rows

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
        return self._start(table, free_slots, owner, now, lease, machine, concurrency, True)

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
        return self._start(table, free_slots, owner, now, lease, machine, concurrency, False)

    def _start(
        self,
        table: str,
        free_slots: int,
        owner: str,
        now: float,
        lease: float,
        machine: str | None,
        concurrency: int | None,
        whole: bool,
    ) -> Later[list[Any]]:
        """The claim: its started attempts as Jobs (``whole``) or as Started."""
        if free_slots < 1:
            return Later.ready([])
        if self.arrays:
            return self._claim_in_sql(
                table, free_slots, owner, now, lease, machine, concurrency, whole
            )
        # The head of the queue (SQLite: BEGIN IMMEDIATE holds the database, so the rows
        # read are the rows written). Read through jobs_queue, already in admission order:
        # ``+run_after`` keeps SQLite off jobs_pending_due, whose range on run_after it would
        # rather take, then sort every due row (1.3 ms a claim at 5,000 pending, against
        # 35 us). The started jobs are built from these rows, not read back: every column for
        # whole Jobs, HEAD_COLUMNS for Started (a poll's claim: measured, 20 us against 28 a
        # read of the head after another process's commit).
        columns, places = (COLUMNS, _WHOLE_PLACES) if whole else (HEAD_COLUMNS, _HEAD_PLACES)
        slots_at, timeout_at, duration_at, path_at, payload_at, run_after_at = places
        head = (
            f"SELECT {columns} FROM jobs "
            "WHERE tbl = ? AND status = 'pending' AND +run_after <= ? "
            "AND (queue_deadline IS NULL OR queue_deadline > ?) "
            f"ORDER BY {QUEUE_ORDER} LIMIT ?",
            (table, now, now, free_slots),
        )
        running = ("SELECT count(*) FROM jobs WHERE tbl = ? AND status = 'processing'", (table,))
        with self._joined() as cur:
            if concurrency is None:
                (queue,) = self._locked_reads(cur, table, [head])
                in_flight = 0
            else:
                counted, queue = self._locked_reads(cur, table, [running, head])
                in_flight = int(counted[0][0])
            chosen = set(
                admit(
                    (Queued(row[0], row[slots_at]) for row in queue),
                    free_slots,
                    in_flight,
                    concurrency,
                )
            )
            started: list[Any] = []
            starts = []
            for row in queue:
                if row[0] not in chosen:
                    continue
                attempt = new_attempt_id()
                deadline = attempt_deadline(row[timeout_at], row[duration_at], now)
                starts.append((row[0], attempt, deadline))
                started.append(
                    started_job(row, owner, machine, attempt, now + lease, deadline, now)
                    if whole
                    else _started(
                        (
                            row[0],
                            attempt,
                            row[path_at],
                            row[payload_at],
                            deadline,
                            now + lease,
                            row[run_after_at],
                        )
                    )
                )
            for chunk in chunks(starts, START_ROWS_MAX):
                self._x(
                    cur,
                    start_attempts(len(chunk)),
                    (owner, machine, now + lease, now, now, *itertools.chain(*chunk)),
                )
                # The database is held: every admitted row must start.
                if cur.rowcount != len(chunk):
                    raise Conflict(f"claim of {table} raced another writer; try again")
        return Later.ready(started)

    def _claim_in_sql(
        self,
        table: str,
        free_slots: int,
        owner: str,
        now: float,
        lease: float,
        machine: str | None,
        concurrency: int | None,
        whole: bool,
    ) -> Later[list[Any]]:
        """``claim`` on PostgreSQL: admission and the attempts' start in one statement
        (rows.CLAIM_PG), one round trip after the lock instead of a read, admission here and
        a write (two, and the lock held across both)."""
        params = {
            "table": table,
            "now": now,
            "free": free_slots,
            "concurrency": concurrency,
            "owner": owner,
            "machine": machine,
            "attempts": [new_attempt_id() for _ in range(free_slots)],
            "lease": now + lease,
        }
        if concurrency is None:  # claims of the queue run side by side (rows.CLAIM_ANY_PG)
            sql = CLAIM_ANY_PG if whole else CLAIM_ANY_STARTED_PG
            claimed = self._send_claim(table, sql, params, shared=True)
        else:
            claimed = self._send_claim(
                table, CLAIM_CAPPED_PG if whole else CLAIM_CAPPED_STARTED_PG, params
            )
        read = job_from_row if whole else _started
        return claimed.then(
            lambda rows: [read(row[1:]) for row in sorted(rows, key=lambda r: int(r[0]))]
        )

    def renew(self, leases: Sequence[tuple[str, str]], now: float, lease: float) -> set[str]:
        """Extend the leases of (job id, attempt) pairs still current; returns their job ids."""
        return self.send_renew(leases, now, lease).result()

    def send_renew(
        self, leases: Sequence[tuple[str, str]], now: float, lease: float
    ) -> Later[set[str]]:
        """``renew``, sent (``Later``)."""
        renewed: set[str] = set()
        if not leases:
            return Later.ready(renewed)
        if self.arrays:  # one statement (one round trip, one run of the jobs triggers)
            ids, attempts = [job for job, _ in leases], [attempt for _, attempt in leases]
            rows = self._send(
                RENEW_PG, (now + lease, now, ids, attempts, ["processing"] * len(ids))
            )
            return rows.then(lambda rows: {row[0] for row in rows})
        with self._joined() as cur:  # each UPDATE stands alone: no savepoint needed
            for job_id, attempt in leases:
                self._x(
                    cur,
                    "UPDATE jobs SET lease_expires_at = ?, updated_at = ? "
                    "WHERE id = ? AND attempt = ? AND status = 'processing'",
                    (now + lease, now, job_id, attempt),
                )
                if cur.rowcount == 1:
                    renewed.add(job_id)
        return Later.ready(renewed)

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
        payloads = [None if result is None else json.dumps(result) for _, _, result in results]

        def recorded(started: dict[str, float | None]) -> list[Recorded]:
            outcomes = []
            for job_id, attempt, result in results:
                if job_id in started:  # once: the same result twice is stale the second time
                    outcomes.append(Recorded(job_id, attempt, "success", "", started.pop(job_id)))
                else:
                    outcomes.append(self._complete_slow(job_id, attempt, result, now, machine))
            return outcomes

        return self._complete_attempts(results, payloads, now, machine).then(recorded)

    def _complete_attempts(
        self,
        results: Sequence[tuple[str, str, Any]],
        payloads: Sequence[str | None],
        now: float,
        machine: str | None,
    ) -> Later[dict[str, float | None]]:
        """The common case of ``complete_many``: the started_at of the jobs it completed. On
        PostgreSQL one statement (needing no transaction of its own: inside transaction() it
        is part of it); on SQLite a statement a chunk, committed together."""
        if len(results) > 1:
            # A job's first result only: a join with two rows for one job would update it
            # with either (PostgreSQL and SQLite alike), and a later one must be stale.
            firsts = {job_id: n for n, (job_id, _, _) in reversed(list(enumerate(results)))}
            if len(firsts) < len(results):
                kept = sorted(firsts.values())
                results, payloads = [results[n] for n in kept], [payloads[n] for n in kept]
        if self.arrays:
            if len(results) > 1:
                rows = self._send(
                    COMPLETE_ATTEMPTS_PG,
                    (now, now, [each[0] for each in results],
                     [each[1] for each in results], list(payloads),
                     ["processing"] * len(results), machine, machine),
                )  # fmt: skip
            else:
                (job_id, attempt, _), payload = results[0], payloads[0]
                rows = self._send(
                    COMPLETE_ATTEMPT_PG,
                    (payload, now, now, job_id, attempt, machine, machine),
                )
                rows = rows.then(lambda found: [(job_id, row[0]) for row in found])
            return rows.then(lambda rows: {row[0]: row[1] for row in rows})
        with self._joined() as cur:
            return Later.ready(self._complete_in_sqlite(cur, results, payloads, machine, now))

    def _complete_in_sqlite(
        self,
        cur: Cursor,
        results: Sequence[tuple[str, str, Any]],
        payloads: Sequence[str | None],
        machine: str | None,
        now: float,
    ) -> dict[str, float | None]:
        started: dict[str, float | None] = {}
        if len(results) > 1:  # a statement for the batch (or a chunk of it)
            values = [
                (job_id, attempt, payload)
                for (job_id, attempt, _), payload in zip(results, payloads, strict=True)
            ]
            for chunk in chunks(values, START_ROWS_MAX):
                self._x(
                    cur,
                    complete_attempts(len(chunk)),
                    (now, now, *itertools.chain(*chunk), machine, machine),
                )
                started.update(cur.fetchall())
            return started
        (job_id, attempt, _), payload = results[0], payloads[0]
        self._x(cur, COMPLETE_ATTEMPT, (payload, now, now, job_id, attempt, machine, machine))
        row = cur.fetchone()
        if row is not None:
            started[job_id] = row[0]
        return started

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
            job = self._transition(job_id, change)
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
        where, params = filters(status=status, tbl=table, pool=pool)
        with self._cursor() as cur:
            self._x(
                cur,
                f"SELECT {COLUMNS} FROM jobs{where} ORDER BY created_at DESC, id DESC LIMIT ?",
                (*params, limit),
            )
            return [job_from_row(row) for row in cur.fetchall()]

    def queue(self, table: str, now: float, limit: int = 100) -> list[Job]:
        """Eligible pending jobs of ``table`` in admission order: the head of jobs_queue,
        read in its order (``+run_after``, as the claim has it: SQLite would rather take
        jobs_pending_due's range and sort every due row, 420 ms for the first 50 of
        1,000,000 against under a millisecond). Delayed jobs that outrank the due ones are
        stepped over one by one, as the claim steps over them (200,000 of them: 119 ms)."""
        with self._cursor() as cur:
            self._x(
                cur,
                f"SELECT {COLUMNS} FROM jobs WHERE tbl = ? AND status = 'pending' "
                f"AND +run_after <= ? ORDER BY {QUEUE_ORDER} LIMIT ?",
                (table, now, limit),
            )
            return [job_from_row(row) for row in cur.fetchall()]

    def delayed(self, table: str, now: float, limit: int = 100) -> list[Job]:
        """The ``limit`` pending jobs of ``table`` due soonest that are not due yet (a
        delay, a retry's backoff), in the order they will be: by due time, then admission
        order. Read in jobs_pending_due's order, which stops at ``limit``; of jobs due at
        the same moment across the cut, which ones come is left to the index (an order by
        priority there too sorted every one of them: a batch enqueued with one delay is due
        at one moment)."""
        with self._cursor() as cur:
            self._x(
                cur,
                f"SELECT {COLUMNS} FROM jobs WHERE tbl = ? AND status = 'pending' "
                "AND run_after > ? ORDER BY run_after LIMIT ?",
                (table, now, limit),
            )
            found = [job_from_row(row) for row in cur.fetchall()]
        found.sort(
            key=lambda job: (job.run_after, *admission_key(job.priority, job.created_at, job.id))
        )
        return found

    def counts(self, table: str | None = None, pool: str | None = None) -> dict[str, int]:
        """Jobs by status (every status present, zero or not). One table's: each status a
        range of jobs_finished (status, tbl, ...), found by the IN list; without it SQLite
        read the whole index for one table (50 ms at 1,000,000 jobs for a table with none,
        and the admin API's /pools counts every pool's). A pool's are read whole either
        way: no index leads with it."""
        where, params = filters(tbl=table, pool=pool)
        if where:
            where += f" AND status IN ({', '.join(repr(status) for status in STATUSES)})"
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

    def queued_slots(self, table: str, now: float, cap: int) -> int:
        """The slots eligible pending jobs of ``table`` need (a job needing 2 slots counts 2),
        over the first ``cap`` of them in queue order: every job needs a slot at least, so
        ``cap`` jobs already need ``cap`` slots and the cost stays flat in the backlog."""
        with self._cursor() as cur:
            self._x(
                cur,
                "SELECT coalesce(sum(slots), 0) FROM (SELECT slots FROM jobs WHERE tbl = ? "
                "AND status = 'pending' AND run_after <= ? LIMIT ?) AS head",
                (table, now, cap),
            )
            return int(cur.fetchone()[0])

    def queue_stats(self, table: str, now: float) -> QueueStats:
        """Pending jobs of ``table`` due and delayed, the due time of the oldest due one, and
        the jobs running: two ranges of the jobs_pending_due index (no row is read; a range
        on run_after, so that SQLite picks that index over jobs_queue) and the running rows."""
        with self._scan() as cur:
            self._x(
                cur,
                "SELECT count(*), min(run_after) FROM jobs WHERE tbl = ? AND status = 'pending' "
                "AND run_after <= ?",
                (table, now),
            )
            due, oldest = cur.fetchone()
            self._x(
                cur,
                "SELECT count(*) FROM jobs WHERE tbl = ? AND status = 'pending' AND run_after > ?",
                (table, now),
            )
            delayed = cur.fetchone()[0]
            self._x(
                cur, "SELECT count(*) FROM jobs WHERE tbl = ? AND status = 'processing'", (table,)
            )
            running = cur.fetchone()[0]
        return QueueStats(int(due), int(delayed), int(running), oldest)

    def ahead_of(self, job: Job, now: float) -> int:
        """Due pending jobs before ``job`` in admission order (policy.jobs.admission_key):
        a range of the jobs_queue index."""
        with self._scan() as cur:
            self._x(
                cur,
                "SELECT count(*) FROM jobs WHERE tbl = ? AND status = 'pending' "
                "AND run_after <= ? AND id <> ? AND (priority > ? OR (priority = ? AND "
                "(created_at < ? OR (created_at = ? AND id < ?))))",
                (job.table, now, job.id, job.priority, job.priority, job.created_at,
                 job.created_at, job.id),
            )  # fmt: skip
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
        return self.send_running_on(machine).result()

    def send_running_on(self, machine: str) -> Later[list[Job]]:
        """``running_on``, sent (``Later``)."""
        rows = self._send(
            f"SELECT {COLUMNS} FROM jobs WHERE status = 'processing' AND machine = ? "
            "ORDER BY started_at, id",
            (machine,),
        )
        return rows.then(lambda rows: [job_from_row(row) for row in rows])

    def send_running(self, machine: str) -> Later[list[Running]]:
        """The jobs whose current attempt runs on ``machine``, as a poll needs them (Running:
        five columns, not the whole row and its JSON; sent as ``send_running_on``)."""
        rows = self._send(
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
        with self._cursor() as cur:
            self._x(
                cur,
                "SELECT DISTINCT machine FROM jobs WHERE status = 'processing' "
                "AND cancel_requested = 1",
            )
            return {row[0] for row in cur.fetchall() if row[0] is not None}


def _started(row: Sequence[Any]) -> Started:
    """A Started of a claim's row (rows.STARTED_COLUMNS)."""
    job_id, attempt, path, payload, deadline, lease_expires_at, run_after = row
    return Started(
        job_id, attempt, path, json.loads(payload), deadline, lease_expires_at, run_after
    )


def _require_current(job: Job, attempt: str) -> None:
    if job.status != "processing" or job.attempt != attempt:
        state = (
            f"the job is on attempt {job.attempt} now"
            if job.status == "processing"
            else f"the job is {job.status}"
        )
        raise StaleAttempt(f"attempt {attempt} of {job.id} is no longer current ({state})")
