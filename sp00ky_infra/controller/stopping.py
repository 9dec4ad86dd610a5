"""Stopping a controller that owns its machines (``dev``): what happens to running work.

- The first signal drains: nothing new is claimed or created, running jobs finish, and a
  line of progress says what is left (``progress``).
- A second signal aborts: the attempts still running go back to the queue at once, due now,
  without spending a retry (``release``), and every machine is destroyed.

``released`` is the pure change of one job row; ``release`` applies it with the store's
compare-and-set, so an attempt that finished meanwhile is left as it ended.
"""

from __future__ import annotations

from dataclasses import dataclass

from sp00ky_infra.store import Job, SqlStore
from sp00ky_infra.store.model import CANCELLED
from sp00ky_infra.store.transitions import end_attempt, error_entry, finish, requeued

STOPPED = "controller_stopped"  # the outcome of an attempt the controller's abort ended


def released(job: Job, attempt: str | None, now: float) -> Job | None:
    """``job`` with its running ``attempt`` ended by the controller's stop: back in the queue,
    due ``now``, its retries untouched (a killed job fails as cancelled instead). None when
    the attempt is no longer the job's current one."""
    if job.status != "processing" or attempt is None or job.attempt != attempt:
        return None
    if job.cancel_requested:
        why = "killed while it ran; the controller stopped"
        return finish(job, "failed", now, error=error_entry(CANCELLED, why, job, now))
    return requeued(job, now, now, attempts=end_attempt(job, now, STOPPED))


def release(store: SqlStore, machines: list[str], now: float) -> list[str]:
    """Every attempt running on ``machines`` back to the queue (``released``); returns the
    ids of the jobs that went back."""
    back = []
    for machine in machines:
        for job in store.running_on(machine):
            attempt = job.attempt

            def change(current: Job, attempt: str | None = attempt) -> Job | None:
                return released(current, attempt, now)

            after = store.jobs.transition(job.id, change)
            if after.status == "pending":
                back.append(job.id)
    return back


@dataclass(frozen=True, slots=True)
class Progress:
    """What a draining stop still waits for."""

    machines: int
    running: int

    def line(self) -> str:
        machines = f"{self.machines} machine{'' if self.machines == 1 else 's'}"
        jobs = f"{self.running} job{'' if self.running == 1 else 's'} running"
        return f"stopping: {machines}, {jobs}"


def progress(store: SqlStore, now: float) -> Progress:
    """Live machines, and the jobs running on them whose lease still runs (a job whose agent
    went silent is not waited for: its lease says it is no longer running)."""
    live = store.machines.live()
    running = sum(
        1
        for machine in live
        for job in store.running_on(machine.name)
        if job.lease_expires_at is not None and job.lease_expires_at > now
    )
    return Progress(len(live), running)
