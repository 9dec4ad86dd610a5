"""The courier: posts a result at once when the job ends while a long-poll is held, so a
result never waits for the poll to return, a result too large to ride a poll, and a killed
job's cancel as soon as the kill arrives (its slot is free once the controller has it)."""

from __future__ import annotations

import dataclasses
import threading
import time

from agent import controller as remote
from agent.errors import ControllerError, Gone, Refused
from agent.jobs import JobRun
from agent.logs import Log
from agent.work import Work

# How long a result waits for the held poll to come back and the next poll to carry it:
# under load polls come back within milliseconds, and a result that rides one costs no request.
COURIER_GRACE_SECONDS = 0.02


class Courier:
    def __init__(self, work: Work, controller: remote.Controller, log: Log) -> None:
        self.work = work
        self.controller = controller  # its own connection, beside the loop's
        self.log = log
        self.queue: list[tuple[JobRun, int | None]] = []  # (run, the poll it waits for)
        self.wake = threading.Event()
        self.gone: str | None = None  # the controller said the machine is gone

    def take(self, run: JobRun, poll: int | None) -> None:
        """Under the lock: ``run``'s result is the courier's, to post unless the poll ``poll``
        comes back within the grace (None: a large result, posted at once)."""
        run.sending = True
        self.queue.append((run, poll))
        self.wake.set()

    def deliver(self) -> None:
        """The thread: posts what it is given until the agent finishes."""
        work = self.work
        while not work.finished.is_set():
            self.wake.wait(1.0)
            self.wake.clear()
            while True:
                with work.lock:
                    if not self.queue:
                        break
                    run, poll = self.queue.pop(0)
                    if poll is not None and not self._held_past_grace(poll):
                        run.sending = False  # the held poll came back: the next one carries it
                        work.wake.set()
                        continue
                self.send(run)

    def _held_past_grace(self, poll: int) -> bool:
        """Wait (under lock) up to the grace for the held poll ``poll`` to come back; True if
        a poll is still out at the end (that one, or a later one that does not carry the
        result), when only the courier can deliver it soon."""
        work = self.work
        ends = time.monotonic() + COURIER_GRACE_SECONDS
        while work.holding and work.polls == poll and not work.finished.is_set():
            left = ends - time.monotonic()
            if left <= 0:
                break
            work.lock.wait(left)
        return work.holding

    def send(self, run: JobRun) -> None:
        assert run.report is not None
        report = dataclasses.replace(run.report, posted=run.posted())
        try:
            answer = self.controller.result(run.job, run.attempt, report)
        except Gone as exc:
            self.gone = str(exc)
            self.work.wake.set()
            return
        except Refused as exc:
            self.log("result_refused", job=run.job, attempt=run.attempt, reason=exc)
            self.work.forget(run)
            return
        except ControllerError as exc:
            self.log("result_held", job=run.job, attempt=run.attempt, reason=exc)
            with self.work.lock:
                run.sending = False  # the loop's next poll carries it
            self.work.wake.set()
            return
        self.work.last_contact = time.monotonic()
        self.log("result", job=run.job, attempt=run.attempt, status=answer.job_status)
        self.work.forget(run)
