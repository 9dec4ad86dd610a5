"""What ``dev`` tells, as lines or in its live view: the controller's events, the outcomes of
jobs (retried, killed, failed for good) and, at start, a pool's breaker that is still open."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from rich.console import Console

from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.state import Event
from sp00ky_infra.store import Job
from sp00ky_infra.store.model import CANCELLED, ErrorEntry, JobStatus

EVENTS_READ = 200  # the controller keeps as many
# The jobs whose outcomes a flush reads, newest first, by status; read at most once a second.
JOBS_READ: dict[JobStatus, int] = {"failed": 100, "pending": 200, "processing": 200, "success": 100}
JOBS_EVERY = 1.0


def clock(at: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


class Happening(NamedTuple):
    """An event, or a job's outcome, as dev tells it."""

    at: float
    pool: str
    kind: str
    message: str

    @classmethod
    def of(cls, event: Event) -> Happening:
        return cls(event.at, event.pool, event.kind, event.message)

    def line(self) -> str:
        return f"{clock(self.at)} {self.pool} {self.kind}: {self.message}"


def error_line(job: Job, index: int) -> tuple[str, str]:
    """The kind and message of ``job``'s error number ``index``: a kill, the attempt that
    failed it for good (its last error, the job failed), or an attempt retried."""
    error: ErrorEntry = job.errors[index]
    code, reason = error.get("code", "?"), error.get("reason", "")
    if code == CANCELLED:
        return "job_killed", f"{job.id} killed ({reason})"
    if index == len(job.errors) - 1 and job.status == "failed":
        return (
            "job_failed",
            f"{job.id} failed for good after {len(job.errors)} failed attempt(s): {code}: {reason}",
        )
    return (
        "job_retried",
        f"{job.id} attempt {error.get('attempt', index + 1)} failed ({code}: {reason}); "
        f"retried ({index + 1} of {job.max_retries} retries)",
    )


def outcomes(job: Job, told: int, since: float) -> list[Happening]:
    """``job``'s errors from number ``told`` on that came at or after ``since``."""
    found = []
    for index in range(told, len(job.errors)):
        at = float(job.errors[index].get("at", 0.0))
        if at >= since:
            kind, message = error_line(job, index)
            found.append(Happening(at, job.pool or "-", kind, message))
    return found


def breaker_lines(controller: Controller, now: float) -> list[str]:
    """For each pool whose stored breaker is open at ``now``: since when, why, until when,
    and what closes it."""
    lines = []
    for name in controller.pools:
        breaker = controller.store.pools.state(name).breaker
        if not breaker.is_open(now) or breaker.open_until is None:
            continue
        opened = [
            i
            for i in controller.store.pools.incidents(name)
            if i.kind == "pool_breaker_open" and i.closed_at is None
        ]
        since = f" since {clock(opened[0].opened_at)} ({opened[0].message})" if opened else ""
        lines.append(
            f"dev: pool {name}: its breaker is OPEN{since}: no new machine until "
            f"{clock(breaker.open_until)}; once the backend is fixed, "
            f"`sp00ky-infra pools reset {name}` closes it"
        )
    return lines


class Happenings:
    """What happened since the last look, oldest first: the controller's new events (known by
    id: several share an instant) and the jobs' new outcomes (a job's errors known by how many
    were told; the store read at most once a second)."""

    def __init__(self, controller: Controller) -> None:
        self.controller = controller
        self.last_event = 0
        self.since = controller.clock()  # earlier runs' outcomes are not this run's
        self.told: dict[str, int] = {}
        self.jobs_read_at = float("-inf")

    def fresh(self, force: bool = False) -> list[Happening]:
        events = self.controller.recent_events(EVENTS_READ)
        found = [Happening.of(e) for e in events if e.id > self.last_event]
        self.last_event = max([self.last_event, *(e.id for e in events[-1:])])
        if force or time.monotonic() - self.jobs_read_at >= JOBS_EVERY:
            self.jobs_read_at = time.monotonic()
            found += self._outcomes(self._jobs())
        return sorted(found, key=lambda happening: happening.at)

    def _jobs(self) -> Iterable[Job]:
        store = self.controller.store
        for status, limit in JOBS_READ.items():
            yield from store.list_jobs(status=status, limit=limit)

    def _outcomes(self, jobs: Iterable[Job]) -> list[Happening]:
        found = []
        for job in jobs:
            told = self.told.get(job.id, 0)
            if len(job.errors) > told and job.updated_at >= self.since:
                found += outcomes(job, told, self.since)
                self.told[job.id] = len(job.errors)
        return found


class EventPrinter:
    """Without a terminal: each event and each job outcome as a line, as it happens."""

    def __init__(self, controller: Controller, console: Console) -> None:
        self.happenings = Happenings(controller)
        self.console = console

    def flush(self, force: bool = False) -> None:
        for happening in self.happenings.fresh(force):
            self.console.print(happening.line(), highlight=False)


class Recent:
    """The live view's last ``shown`` happenings (it is redrawn from more than one thread)."""

    def __init__(self, controller: Controller, shown: int = 10) -> None:
        self.happenings = Happenings(controller)
        self.kept: deque[Happening] = deque(maxlen=shown)
        self._lock = threading.Lock()

    def rows(self) -> list[Happening]:
        with self._lock:
            self.kept.extend(self.happenings.fresh())
            return list(self.kept)
