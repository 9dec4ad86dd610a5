"""The watchdog: gives a job up on the agent's own clock, before the controller can count its
lease as expired, whatever any network call is doing (a silent partition blocks calls; it
cannot delay the watchdog)."""

from __future__ import annotations

from agent.backend import Backend
from agent.clock import Clock, Monotonic
from agent.leases import abandon_at, watch_pause
from agent.logs import Log
from agent.work import Work


class Watchdog:
    def __init__(self, work: Work, backend: Backend, log: Log, clock: Clock | None = None) -> None:
        self.work = work
        self.backend = backend
        self.log = log
        self.clock = clock or Monotonic()

    def watch(self) -> None:
        """The thread: gives up the jobs whose leases were not renewed in time."""
        work = self.work
        while not work.finished.is_set():
            with work.lock:
                now = self.clock.now()
                due = [
                    run
                    for run in work.running()
                    if now >= abandon_at(run.renewed_at, work.lease, work.margin)
                ]
                for run in due:
                    del work.runs[run.job]
                stop_backend = bool(due) and not work.running()
                give_up = work.give_up_at()
            if not due:
                # Its own time wakes it (leases.watch_pause), or the end; never the lock's
                # notifications, several a job, none of which brings a give-up point closer.
                pause = watch_pause(now, give_up, work.poll_sent, work.lease, work.margin)
                self.clock.wait(work.finished, pause)
                continue
            for run in due:
                self.log("abandon", job=run.job, attempt=run.attempt, reason="lease not renewed")
                run.stop("abandoned")
            if stop_backend:
                # the work must end now, not when a blocked poll returns: the loop starts the
                # backend again once it is idle
                self.log("backend_stop", reason="jobs abandoned")
                self.backend.stop()
            work.wake.set()
