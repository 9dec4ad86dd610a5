"""What the agent's three threads share, under one lock: the loop polls (it carries finished
results, renews the leases and takes new work in one round trip), the courier posts a result
that should not wait for a held poll, and the watchdog gives a job up on its own clock."""

from __future__ import annotations

import threading
import time

from agent.jobs import JobRun
from agent.leases import abandon_at


class Work:
    def __init__(self) -> None:
        self.runs: dict[str, JobRun] = {}  # by job id: running, or finished and unreported
        # guards the runs, their renewals and which sender owns a result
        self.lock = threading.Condition()
        self.wake = threading.Event()  # the loop's: a job ended, a signal, a result held back
        self.finished = threading.Event()  # the agent is leaving: the other threads end
        self.lease = 0.0  # the pool's, and the safety margin taken from it, once joined
        self.margin = 0.0
        self.holding = False  # a long-poll is out: a result that ends now may go by courier
        self.polls = 0  # polls sent: the courier's grace ends when the held one came back
        self.poll_sent = time.monotonic()  # the last poll's send time (leases.watch_pause)
        self.last_contact = time.monotonic()  # the controller's last answer

    def running(self) -> list[JobRun]:
        return [run for run in self.runs.values() if not run.done.is_set()]

    def occupied(self) -> list[JobRun]:
        """The runs that hold a slot (under lock): running and not stopped. A finished or
        killed job's slot is free while its result is on its way."""
        return [run for run in self.running() if run.stopped is None]

    def give_up_at(self) -> float | None:
        """The monotonic time the first running job is given up, if any runs (under lock)."""
        points = [abandon_at(run.renewed_at, self.lease, self.margin) for run in self.running()]
        return min(points, default=None)

    def forget(self, run: JobRun) -> None:
        with self.lock:
            if self.runs.get(run.job) is run:
                del self.runs[run.job]
