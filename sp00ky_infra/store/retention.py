"""Retention: finished rows deleted in batches, each folded into the hourly counters first.

Pending and processing rows are never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from sp00ky_infra.config.durations import DurationError, parse_duration
from sp00ky_infra.store.dialect import DEFAULT_BATCH, Dialect, Sql
from sp00ky_infra.store.model import TERMINAL, Conflict, Job, JobStatus
from sp00ky_infra.store.rows import COLUMNS, filters, job_from_row

T = TypeVar("T")


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

    def as_json(self) -> dict[str, Any]:
        return {
            "table": self.table,
            "hour": self.hour,
            "hour_utc": datetime.fromtimestamp(self.hour, UTC).strftime("%Y-%m-%dT%H:00Z"),
            "outcome": self.outcome,
            "count": self.count,
        }


def counters_json(counters: Sequence[Counter], since: float | None) -> dict[str, Any]:
    """The counters as ``jobs stats --json`` and the admin API's ``GET /stats`` give them:
    each hour's, and the totals per table and outcome."""
    totals: dict[tuple[str, str], int] = {}
    for counter in counters:
        key = (counter.table, counter.outcome)
        totals[key] = totals.get(key, 0) + counter.count
    return {
        "since": since,
        "hours": [counter.as_json() for counter in counters],
        "totals": [
            {"table": table, "outcome": outcome, "count": count}
            for (table, outcome), count in sorted(totals.items())
        ],
    }


Progress = Callable[[int], None]  # told the rows each batch deleted, once it is committed


def hour_of(at: float) -> int:
    """The start of the hour ``at`` falls in (unix time): a counter's hour."""
    return int(at // 3600) * 3600


@dataclass(frozen=True, slots=True)
class Folded:
    """A table whose ended rows are folded into hourly counters before they are deleted: the
    counters' table, the column they are kept by, and the DELETE of a batch of rows by id
    (``{marks}``: the ids' placeholders)."""

    counters: str
    key: str
    delete: str


JOB_ROWS = Folded(
    "job_counters",
    "tbl",
    "DELETE FROM jobs WHERE id IN ({marks}) AND status IN ('success', 'failed')",
)
DELETE_BATCH = 200  # ids a DELETE names


def fold_and_delete(sql: Sql, folded: Folded, rows: Sequence[Sequence[Any]]) -> None:
    """Count ``rows`` (id, key, outcome, finished_at) into ``folded``'s hourly counters, then
    delete them, in the transaction of ``sql``."""
    counts: dict[tuple[str, int, str], int] = {}
    for _, key, outcome, finished_at in rows:
        counter = (key, hour_of(finished_at or 0.0), outcome)
        counts[counter] = counts.get(counter, 0) + 1
    for (key, hour, outcome), count in counts.items():
        sql.execute(
            f"INSERT INTO {folded.counters} ({folded.key}, hour, outcome, count) "
            f"VALUES (?, ?, ?, ?) ON CONFLICT ({folded.key}, hour, outcome) "
            f"DO UPDATE SET count = {folded.counters}.count + excluded.count",
            (key, hour, outcome, count),
        )
    for start in range(0, len(rows), DELETE_BATCH):
        ids = [row[0] for row in rows[start : start + DELETE_BATCH]]
        sql.execute(folded.delete.format(marks=", ".join("?" for _ in ids)), ids)


@dataclass(frozen=True, slots=True)
class Deleted(Generic[T]):
    """What a clear answers of each job it deleted (its id, or the whole Job): the columns it
    reads of the rows, and the answer and the row to fold (``fold_and_delete``) of each."""

    columns: str
    read: Callable[[Sequence[Any]], tuple[T, Sequence[Any]]]


def _whole(row: Sequence[Any]) -> tuple[Job, Sequence[Any]]:
    job = job_from_row(row)
    return job, (job.id, job.table, job.status, job.finished_at)


IDS: Deleted[str] = Deleted("id, tbl, status, finished_at", lambda row: (row[0], row))
JOBS: Deleted[Job] = Deleted(COLUMNS, _whole)


def since_time(text: str | None, now: float) -> float | None:
    """``jobs stats --since`` / ``GET /stats?since=``: a duration back from now (``24h``), a
    UTC date or time (``2026-11-30``, ``2026-11-30T10:00``) or a unix time; None for all.
    Raises ValueError saying how to write one."""
    if not text:
        return None
    try:
        return now - parse_duration(text)
    except DurationError:
        pass
    try:
        return float(text)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"since: {text!r} is neither a duration (24h, 7d) nor a date or time "
            "(2026-11-30, 2026-11-30T10:00, UTC)"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


class Retention:
    """The jobs' hourly counters, and the deletes that feed them."""

    def __init__(self, db: Dialect) -> None:
        self._db = db

    def counters(self, table: str | None = None, since: float | None = None) -> list[Counter]:
        """The hourly counters, by table, hour and outcome; with ``since``, the hours that
        end after it (the hour ``since`` falls in counts)."""
        where, params = filters(tbl=table)
        if since is not None:
            where += (" AND" if where else " WHERE") + " hour > ?"
            params = (*params, since - 3600)
        with self._db.read() as sql:
            sql.execute(
                f"SELECT tbl, hour, outcome, count FROM job_counters{where} "
                "ORDER BY tbl, hour, outcome",
                params,
            )
            return [Counter(row[0], int(row[1]), row[2], int(row[3])) for row in sql.fetchall()]

    def prune(
        self,
        now: float,
        success_window: float,
        failed_window: float,
        max_rows: int = 0,
        batch: int = DEFAULT_BATCH,
        progress: Progress | None = None,
    ) -> PruneReport:
        """Delete finished rows older than their window, and successful rows beyond
        ``max_rows`` per table (oldest first), folding each into the hourly counters first.
        Pending and processing rows are never touched."""
        deleted = {"success": 0, "failed": 0}
        for status, window in (("success", success_window), ("failed", failed_window)):
            deleted[status] += len(
                self._delete_where(
                    "status = ? AND finished_at < ?",
                    (status, now - window),
                    batch,
                    IDS,
                    progress=progress,
                )
            )
        if max_rows > 0:
            deleted["success"] += self._trim_to(max_rows, batch, progress)
        return PruneReport({key: value for key, value in deleted.items() if value})

    def clear(
        self,
        status: JobStatus | None = None,
        batch: int = DEFAULT_BATCH,
        limit: int | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Delete terminal jobs (all, or those of one terminal status) in batches; with
        ``limit``, at most that many, the oldest finished first. ``progress(n)`` is told
        after each batch."""
        return len(self._clear(status, batch, limit, IDS, progress))

    def clear_jobs(
        self,
        status: JobStatus | None = None,
        batch: int = DEFAULT_BATCH,
        limit: int | None = None,
        progress: Progress | None = None,
    ) -> list[Job]:
        """``clear``, answering the deleted jobs as they were (``jobs clear --json``)."""
        return self._clear(status, batch, limit, JOBS, progress)

    def _clear(
        self,
        status: JobStatus | None,
        batch: int,
        limit: int | None,
        answer: Deleted[T],
        progress: Progress | None,
    ) -> list[T]:
        if status is not None and status not in TERMINAL:
            raise Conflict(f"clear deletes finished jobs only (success or failed), not {status}")
        if limit is not None and limit < 1:
            raise Conflict(f"clear --limit is at least 1, not {limit}")
        condition = "status = ?" if status else "status IN (?, ?)"
        return self._delete_where(
            condition,
            (status,) if status else TERMINAL,
            batch,
            answer,
            limit=limit,
            progress=progress,
        )

    def _trim_to(self, max_rows: int, batch: int, progress: Progress | None = None) -> int:
        with self._db.read() as sql:
            sql.execute("SELECT tbl, count(*) FROM jobs WHERE status = 'success' GROUP BY tbl")
            over = {row[0]: int(row[1]) - max_rows for row in sql.fetchall()}
        removed = 0
        for table, excess in over.items():
            while excess > 0:
                take = min(excess, batch)
                with self._db.write() as sql:
                    sql.execute(
                        "SELECT id, tbl, status, finished_at FROM jobs WHERE tbl = ? "
                        "AND status = 'success' ORDER BY finished_at, id LIMIT ?",
                        (table, take),
                    )
                    rows = sql.fetchall()
                    fold_and_delete(sql, JOB_ROWS, rows)
                removed += len(rows)
                excess -= len(rows)
                if progress is not None and rows:
                    progress(len(rows))
                if not rows:
                    break
        return removed

    def _delete_where(
        self,
        condition: str,
        params: Sequence[Any],
        batch: int,
        answer: Deleted[T],
        limit: int | None = None,
        progress: Progress | None = None,
    ) -> list[T]:
        """Delete the matching rows batch by batch, each folded into the counters first; what
        ``answer`` reads of each. With ``limit``, the oldest finished first."""
        removed: list[T] = []
        order = " ORDER BY finished_at, id" if limit is not None else ""
        while True:
            take = batch if limit is None else min(batch, limit - len(removed))
            if take <= 0:
                return removed
            with self._db.write() as sql:
                sql.execute(
                    f"SELECT {answer.columns} FROM jobs WHERE {condition}{order} LIMIT ?",
                    (*params, take),
                )
                read = [answer.read(row) for row in sql.fetchall()]
                removed.extend(each for each, _ in read)
                rows = [row for _, row in read]
                fold_and_delete(sql, JOB_ROWS, rows)
            if progress is not None and rows:
                progress(len(rows))  # after the batch's commit: these rows are gone
            if len(rows) < take:
                return removed
