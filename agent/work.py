"""What the agent's three threads share, under one lock: the loop polls (it carries finished
results, renews the leases and takes new work in one round trip), the courier sends what
should not wait for a held poll on a poll beside it, and the watchdog gives a job up on its
own clock."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from agent.jobs import JobRun
from agent.leases import abandon_at
from agent.protocol import PollRequest

# The attempts whose results the controller has, kept so that none starts again: an
# assignment sent again (a lost answer, as a poll saw it) may cross the poll that ended it.
ENDED_KEPT = 1024


@dataclass
class Outgoing:
    """One poll: its request, the finished runs whose results it carries, whether the backend
    could take work when it was made, its timeout and (once sent) its send time."""

    request: PollRequest
    carried: list[JobRun]
    alive: bool
    timeout: float
    sent: float = 0.0


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
        self.offered = 0  # the free slots the held poll offers (0: it waits for kills only)
        self.polls = 0  # polls sent: the courier's grace ends when the held one came back
        self.besides = 0  # the courier's polls beside the held one, out or being taken in
        self.poll_sent = time.monotonic()  # the last poll's send time (leases.watch_pause)
        self.last_contact = time.monotonic()  # the controller's last answer
        self.ended: dict[str, None] = {}  # attempts the controller has the results of

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
        """The controller has ``run``'s result (or refused it for good): it is done with."""
        with self.lock:
            if self.runs.get(run.job) is run:
                del self.runs[run.job]
            self.ended[run.attempt] = None
            if len(self.ended) > ENDED_KEPT:
                del self.ended[next(iter(self.ended))]
