"""A fan-out schedule's fires in the store (``forEach``): its query, run read-only, and one
job per row, each made once.

A fire runs in two steps. ``open`` records the fire's rows, one run each keyed by
(schedule, fire time, row key) and waiting for its job, in one transaction with the
schedule's cursor: the rows are fixed once, whichever controller then writes their jobs.
``fire_items`` writes the jobs of waiting runs a batch at a time, each run's job at most
once (a run waiting has no job; writing one is a guarded update), so a controller that
dies mid fan-out leaves runs waiting and the one that takes over writes the rest. A
waiting run counts as its row's previous run still going, so concurrency applies per row.

The query runs on a connection of its own that cannot write: SQLite opens the database
read-only with ``PRAGMA query_only``; PostgreSQL runs it as one server-side cursor's SELECT
(never a second statement) in a READ ONLY transaction with ``statement_timeout``. A query
that writes, runs past its time limit or errs raises ``FanOutQueryError``: the fire fails,
nothing is fanned out.
"""

from __future__ import annotations

import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import errors

from sp00ky_infra.policy.schedules import ConcurrencyPolicy, on_fire
from sp00ky_infra.store.dialect import Dialect, Sql
from sp00ky_infra.store.jobs import queued_in
from sp00ky_infra.store.model import NewJob, StoreError, StoreUnavailable
from sp00ky_infra.store.postgres import PostgresStore
from sp00ky_infra.store.rows import INSERT_JOB, insert_row
from sp00ky_infra.store.schedules import INSERT_RUN, Run, new_run_id, take_fire
from sp00ky_infra.store.sqlite import SqliteStore
from sp00ky_infra.store.transitions import new_job_id, validate_new

PROGRESS_STEPS = 1000  # SQLite's virtual machine steps between looks at the query's deadline


class FanOutQueryError(StoreError):
    """A fan-out's query failed: it wrote, ran too long, or the database refused it."""


@dataclass(frozen=True, slots=True)
class Waiting:
    """A fan-out's run whose job is not written yet."""

    run_id: str
    fire_at: float
    item: str


@dataclass(frozen=True, slots=True)
class FannedOut:
    """What one ``fire_items`` did: the jobs written (item, job id), the rows ended without
    one (skipped: their previous run still going; or replaced by a later fire's row before
    their job was written), the jobs of replaced runs (to be killed), and whether it stopped
    for want of room in the pool's queue."""

    made: tuple[tuple[str, str], ...] = ()
    without_job: int = 0
    replaced_jobs: tuple[str, ...] = ()
    full: bool = False


def read_only_rows(
    db: Dialect, query: str, max_rows: int, timeout: float
) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    """The column names and at most ``max_rows + 1`` rows of ``query``, run read-only within
    ``timeout`` seconds against the store's database (one more row than allowed says that
    there are too many, without reading them all)."""
    if isinstance(db, PostgresStore):
        return _postgres_rows(db.url, query, max_rows, timeout)
    if isinstance(db, SqliteStore):
        return _sqlite_rows(db.path, query, max_rows, timeout)
    raise FanOutQueryError(f"a fan-out's query cannot run on a {db.name} store")


def _sqlite_rows(
    path: str, query: str, max_rows: int, timeout: float
) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    uri = f"file:{urllib.parse.quote(path)}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
    except sqlite3.Error as exc:
        raise StoreUnavailable(f"cannot open {path} to run the fan-out's query: {exc}") from exc
    deadline = time.monotonic() + timeout
    conn.set_progress_handler(lambda: int(time.monotonic() > deadline), PROGRESS_STEPS)
    try:
        conn.execute("PRAGMA query_only = ON")
        cur = conn.execute(query)
        rows = cur.fetchmany(max_rows + 1)
        columns = tuple(column[0] for column in cur.description or ())
    except sqlite3.Error as exc:
        if time.monotonic() > deadline:
            raise FanOutQueryError(_too_long(timeout)) from exc
        raise FanOutQueryError(f"the query failed: {exc}") from exc
    finally:
        conn.close()
    return columns, rows


def _postgres_rows(
    url: str, query: str, max_rows: int, timeout: float
) -> tuple[tuple[str, ...], list[tuple[Any, ...]]]:
    try:
        conn = psycopg.connect(url, connect_timeout=10)
    except psycopg.Error as exc:
        raise StoreUnavailable(f"cannot connect to run the fan-out's query: {exc}") from exc
    try:
        conn.read_only = True  # BEGIN READ ONLY
        conn.execute(
            "SELECT set_config('statement_timeout', %s, true)", (f"{int(timeout * 1000)}ms",)
        )
        # A server-side cursor: DECLARE takes one SELECT (never a second statement), and only
        # the rows fetched cross the wire.
        with conn.cursor(name="spky_fan_out") as cur:
            cur.execute(query.strip().rstrip(";"))
            rows = cur.fetchmany(max_rows + 1)
            columns = tuple(column.name for column in cur.description or ())
    except errors.QueryCanceled as exc:
        raise FanOutQueryError(_too_long(timeout)) from exc
    except psycopg.Error as exc:
        raise FanOutQueryError(f"the query failed: {str(exc).strip()}") from exc
    finally:
        conn.rollback()
        conn.close()
    return columns, rows


def _too_long(timeout: float) -> str:
    return f"the query ran past its time limit ({timeout:g}s); speed it up or raise forEach.timeout"


class FanOuts:
    """Fan-out fires: their waiting runs and the jobs written for them."""

    def __init__(self, db: Dialect) -> None:
        self._db = db

    def open(self, schedule: str, fire_at: float, now: float, items: Sequence[str]) -> bool:
        """Record the fire of ``schedule`` for ``fire_at``: a waiting run per item, with the
        cursor; False (nothing written) when that fire was made already."""
        with self._db.write() as sql:
            if not take_fire(sql, schedule, fire_at, now):
                return False
            sql.executemany(
                INSERT_RUN,
                [
                    Run(new_run_id(), schedule, fire_at, now, "pending", None, None, item).row()
                    for item in items
                ],
            )
        return True

    def waiting(self, schedule: str, limit: int) -> list[Waiting]:
        """The schedule's runs waiting for their jobs, the oldest fire first."""
        with self._db.read() as sql:
            sql.execute(
                "SELECT id, fire_at, item FROM schedule_runs WHERE schedule = ? "
                "AND status = 'pending' AND job_id IS NULL ORDER BY fire_at, item LIMIT ?",
                (schedule, limit),
            )
            return [Waiting(row[0], row[1], row[2]) for row in sql.fetchall()]

    def fire_items(
        self,
        schedule: str,
        batch: Sequence[Waiting],
        now: float,
        policy: ConcurrencyPolicy,
        job_for: Callable[[str], NewJob],
        max_queued: int | None = None,
    ) -> FannedOut:
        """Write the jobs of ``batch`` (each as ``policy`` says given its row's previous
        runs), in one transaction, as many as the pool's queue has room for."""
        if not batch:
            return FannedOut()
        sample = job_for(batch[0].item)
        with self._db.write() as sql:
            sql.lock(f"schedule:{schedule}")
            room = len(batch)
            if max_queued is not None and sample.pool is not None:
                room = max(0, max_queued - queued_in(sql, sample.pool, sample.table))
            going = _going_by_item(sql, schedule)
            made: list[tuple[str, str]] = []
            replaced: list[str] = []
            without_job = 0
            full = False
            latest = {each.item: each.fire_at for each in batch}  # in fire time order
            for each in batch:
                runs = going.setdefault(each.item, [])
                previous = [run for run in runs if run[2] < each.fire_at]
                action = on_fire(policy, bool(previous))
                if policy == "replace" and latest[each.item] > each.fire_at:
                    action = "skip"  # a later fire's row replaces it before it has a job
                if action == "skip":
                    ended = "skipped" if policy == "skip" else "replaced"
                    without_job += _end_waiting(sql, each, ended, now)
                    runs[:] = [run for run in runs if run[0] != each.run_id]
                    continue
                if len(made) >= room:
                    full = True
                    break
                job_id = _write_job(sql, each, job_for(each.item), now)
                if job_id is None:
                    continue  # another controller wrote it
                made.append((each.item, job_id))
                if action == "replace":
                    replaced.extend(_replace(sql, previous, now))
                    runs[:] = [run for run in runs if run not in previous]
                runs[:] = [run for run in runs if run[0] != each.run_id]
                runs.append((each.run_id, job_id, each.fire_at))
            if made:
                sql.changed()
        return FannedOut(tuple(made), without_job, tuple(replaced), full)


def _going_by_item(sql: Sql, schedule: str) -> dict[str, list[tuple[str, str | None, float]]]:
    """(run id, job id, fire time) of each row's runs still going: their job pending or
    processing, or not written yet."""
    sql.execute(
        "SELECT r.id, r.job_id, r.fire_at, r.item FROM schedule_runs r "
        "LEFT JOIN jobs j ON j.id = r.job_id WHERE r.schedule = ? "
        "AND r.status IN ('pending', 'processing') "
        "AND (r.job_id IS NULL OR j.status IN ('pending', 'processing'))",
        (schedule,),
    )
    going: dict[str, list[tuple[str, str | None, float]]] = {}
    for run_id, job_id, fire_at, item in sql.fetchall():
        going.setdefault(item, []).append((run_id, job_id, fire_at))
    return going


def _end_waiting(sql: Sql, run: Waiting, status: str, now: float) -> int:
    sql.execute(
        "UPDATE schedule_runs SET status = ?, finished_at = ? "
        "WHERE id = ? AND status = 'pending' AND job_id IS NULL",
        (status, now, run.run_id),
    )
    return sql.rowcount


def _write_job(sql: Sql, run: Waiting, new: NewJob, now: float) -> str | None:
    """The job of a waiting run, written once: None when the run has one already."""
    validate_new(new)
    job_id = new_job_id(new.table)
    sql.execute(
        "UPDATE schedule_runs SET job_id = ? WHERE id = ? AND status = 'pending' "
        "AND job_id IS NULL",
        (job_id, run.run_id),
    )
    if sql.rowcount != 1:
        return None
    sql.execute(INSERT_JOB, insert_row(new, job_id, now))
    return job_id


def _replace(sql: Sql, previous: list[tuple[str, str | None, float]], now: float) -> list[str]:
    """Mark a row's previous runs replaced; the jobs among them to kill."""
    for run_id, _, _ in previous:
        sql.execute(
            "UPDATE schedule_runs SET status = 'replaced', finished_at = ? WHERE id = ?",
            (now, run_id),
        )
    return [job_id for _, job_id, _ in previous if job_id is not None]
