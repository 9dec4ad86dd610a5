"""Recovery: the sweep that expires leases and times out attempts and queue waits.

Each change is one compare-and-set through ``JobTable.transition``, so a renewal or a report
that lands first wins.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

from sp00ky_infra.store.dialect import DEFAULT_BATCH, Dialect
from sp00ky_infra.store.jobs import JobTable
from sp00ky_infra.store.machines import machine_key
from sp00ky_infra.store.model import LEASE_EXPIRED, QUEUE_TIMEOUT, TIMEOUT, Job, JobNotFound
from sp00ky_infra.store.transitions import overdue


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one recovery sweep changed: job ids by reason."""

    lease_expired: tuple[str, ...] = ()
    timed_out: tuple[str, ...] = ()
    queue_timed_out: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return len(self.lease_expired) + len(self.timed_out) + len(self.queue_timed_out)


class Sweeper:
    """The recovery sweep of the jobs table."""

    def __init__(self, db: Dialect, jobs: JobTable) -> None:
        self._db = db
        self._jobs = jobs

    def sweep(self, now: float, batch: int = DEFAULT_BATCH) -> SweepReport:
        """Expire leases, time out attempts past their deadline, fail jobs past their queue
        deadline. Each change is its own compare-and-set, so a renewal or report that lands
        between the read and the write wins and the job is left alone."""
        with self._db.read() as sql:
            # Two ranges (jobs_lease, jobs_deadline), not an OR that reads every running row.
            sql.execute(
                "SELECT id, machine FROM jobs WHERE status = 'processing' "
                "AND lease_expires_at < ? "
                "UNION SELECT id, machine FROM jobs WHERE status = 'processing' "
                "AND deadline IS NOT NULL AND deadline < ? LIMIT ?",
                (now, now, batch),
            )
            running: list[tuple[str, str | None]] = [(row[0], row[1]) for row in sql.fetchall()]
            sql.execute(
                "SELECT id FROM jobs WHERE status = 'pending' AND queue_deadline IS NOT NULL "
                "AND queue_deadline < ? LIMIT ?",
                (now, batch),
            )
            waiting = [(row[0], None) for row in sql.fetchall()]
        changed: dict[str, list[str]] = {LEASE_EXPIRED: [], TIMEOUT: [], QUEUE_TIMEOUT: []}
        for job_id, machine in running + waiting:
            # A running job's machine's key first, as the machine's polls and results hold it:
            # the change locks the job's row, then (its busy slots) the machine's, which a poll
            # that renews the job may hold while it waits for the job's (machine_key).
            with self._db.transaction(key=machine_key(machine)) if machine else nullcontext():
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
            self._jobs.transition(job_id, change)
        except JobNotFound:
            return None  # cleared meanwhile
        return verdict[0] if verdict else None
