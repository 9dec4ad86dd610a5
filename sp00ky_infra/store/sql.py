"""The job store in SQL, written once for SQLite and PostgreSQL: one object over the tables.

The jobs (``jobs.py``), their recovery (``sweep.py``) and retention (``retention.py``),
machines and pools (``machines.py``) are tables on the store's dialect core
(``dialect.py``), whose connections, transactions and locking ``sqlite.py`` and
``postgres.py`` supply. The store answers the jobs' calls itself too, each passed on to its
table.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sp00ky_infra.store.dialect import DEFAULT_BATCH, Dialect, Later
from sp00ky_infra.store.jobs import JobTable, QueueStats
from sp00ky_infra.store.machines import MachineTable, PoolTable
from sp00ky_infra.store.model import ErrorEntry, Job, JobStatus, NewJob, Recorded, Running, Started
from sp00ky_infra.store.retention import Counter, Progress, PruneReport, Retention
from sp00ky_infra.store.sweep import Sweeper, SweepReport


class SqlStore(Dialect):
    """Job rows, machine rows and pool state on a SQL database. Subclasses supply the dialect."""

    # In this process, no network between: a call returns in microseconds (or waits on this
    # process's other writers), so an event loop may make it itself rather than hand it to a
    # thread (the agents' hot routes do).
    embedded = False

    def checkpoint_in_background(self) -> None:
        """A long-running process's store: keep the database's housekeeping off its commits
        where the database leaves it to them (SQLite's checkpoints); nothing elsewhere."""

    def ensure_statistics(self) -> bool:
        """Give the planner statistics for a jobs table that has rows and was never analyzed,
        where the database would otherwise wait to (PostgreSQL's autovacuum); True when it
        analyzed. The controller's tick calls it; nothing to do elsewhere (SQLite)."""
        return False

    @functools.cached_property
    def jobs(self) -> JobTable:
        return JobTable(self)

    @functools.cached_property
    def sweeper(self) -> Sweeper:
        return Sweeper(self, self.jobs)

    @functools.cached_property
    def retention(self) -> Retention:
        return Retention(self)

    @functools.cached_property
    def machines(self) -> MachineTable:
        return MachineTable(self)

    @functools.cached_property
    def pools(self) -> PoolTable:
        return PoolTable(self)

    # --- the jobs' calls, each passed on to its table --------------------------------------

    def enqueue(self, new: NewJob, now: float, max_queued: int | None = None) -> Job:
        return self.jobs.enqueue(new, now, max_queued)

    def enqueue_many(
        self, news: Sequence[NewJob], now: float, max_queued: int | None = None
    ) -> list[str]:
        return self.jobs.enqueue_many(news, now, max_queued)

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
        return self.jobs.claim(table, free_slots, owner, now, lease, machine, concurrency)

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
        return self.jobs.send_claim(table, free_slots, owner, now, lease, machine, concurrency)

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
        return self.jobs.send_start(table, free_slots, owner, now, lease, machine, concurrency)

    def renew(self, leases: Sequence[tuple[str, str]], now: float, lease: float) -> set[str]:
        return self.jobs.renew(leases, now, lease)

    def send_renew(
        self, leases: Sequence[tuple[str, str]], now: float, lease: float
    ) -> Later[set[str]]:
        return self.jobs.send_renew(leases, now, lease)

    def complete(self, job_id: str, attempt: str, result: Any, now: float) -> Job:
        return self.jobs.complete(job_id, attempt, result, now)

    def complete_many(
        self, results: Sequence[tuple[str, str, Any]], now: float, machine: str | None = None
    ) -> list[Recorded]:
        return self.jobs.complete_many(results, now, machine)

    def send_complete_many(
        self, results: Sequence[tuple[str, str, Any]], now: float, machine: str | None = None
    ) -> Later[list[Recorded]]:
        return self.jobs.send_complete_many(results, now, machine)

    def fail_attempt(
        self, job_id: str, attempt: str, error: ErrorEntry, now: float, retryable: bool = True
    ) -> Job:
        return self.jobs.fail_attempt(job_id, attempt, error, now, retryable)

    def confirm_cancel(self, job_id: str, attempt: str, now: float) -> Job:
        return self.jobs.confirm_cancel(job_id, attempt, now)

    def kill(self, job_id: str, now: float) -> Job:
        return self.jobs.kill(job_id, now)

    def retry(self, job_id: str, now: float) -> Job:
        return self.jobs.retry(job_id, now)

    def get(self, job_id: str) -> Job:
        return self.jobs.get(job_id)

    def list_jobs(
        self,
        status: JobStatus | None = None,
        limit: int = 100,
        table: str | None = None,
        pool: str | None = None,
    ) -> list[Job]:
        return self.jobs.list_jobs(status, limit, table, pool)

    def queue(self, table: str, now: float, limit: int = 100) -> list[Job]:
        return self.jobs.queue(table, now, limit)

    def delayed(self, table: str, now: float, limit: int = 100) -> list[Job]:
        return self.jobs.delayed(table, now, limit)

    def counts(self, table: str | None = None, pool: str | None = None) -> dict[str, int]:
        return self.jobs.counts(table, pool)

    def queued(self, table: str, now: float, cap: int) -> int:
        return self.jobs.queued(table, now, cap)

    def queued_slots(self, table: str, now: float, cap: int) -> int:
        return self.jobs.queued_slots(table, now, cap)

    def queue_stats(self, table: str, now: float) -> QueueStats:
        return self.jobs.queue_stats(table, now)

    def ahead_of(self, job: Job, now: float) -> int:
        return self.jobs.ahead_of(job, now)

    def busy_slots(self, table: str) -> dict[str, int]:
        return self.jobs.busy_slots(table)

    def running_on(self, machine: str) -> list[Job]:
        return self.jobs.running_on(machine)

    def send_running_on(self, machine: str) -> Later[list[Job]]:
        return self.jobs.send_running_on(machine)

    def send_running(self, machine: str) -> Later[list[Running]]:
        return self.jobs.send_running(machine)

    def cancelling_machines(
        self,
    ) -> set[str]:
        return self.jobs.cancelling_machines()

    def sweep(self, now: float, batch: int = DEFAULT_BATCH) -> SweepReport:
        return self.sweeper.sweep(now, batch)

    def counters(self, table: str | None = None, since: float | None = None) -> list[Counter]:
        return self.retention.counters(table, since)

    def prune(
        self,
        now: float,
        success_window: float,
        failed_window: float,
        max_rows: int = 0,
        batch: int = DEFAULT_BATCH,
        progress: Progress | None = None,
    ) -> PruneReport:
        return self.retention.prune(now, success_window, failed_window, max_rows, batch, progress)

    def clear(
        self,
        status: JobStatus | None = None,
        batch: int = DEFAULT_BATCH,
        limit: int | None = None,
        progress: Progress | None = None,
    ) -> int:
        return self.retention.clear(status, batch, limit, progress)

    def clear_jobs(
        self,
        status: JobStatus | None = None,
        batch: int = DEFAULT_BATCH,
        limit: int | None = None,
        progress: Progress | None = None,
    ) -> list[Job]:
        return self.retention.clear_jobs(status, batch, limit, progress)
