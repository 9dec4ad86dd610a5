"""The courier: what should not wait for a held long-poll goes beside it, on the courier's
own connection. A result that ends while the held poll offers a free slot waits the grace for
that poll to come back and carry it; under a full machine's held poll (which comes back only
for a kill) the courier sends it at once, with the results of the jobs started with it
(``settle``). A killed job's cancel goes at once. They go on a poll ``beside`` the held one,
whose answer takes work for the slots they free (one request for the results that end
together, as a poll that carries them); a result too large to ride a poll is posted on its
own."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Protocol

from agent import controller as remote
from agent.errors import ControllerError, Gone, Refused
from agent.jobs import JobRun
from agent.logs import Log
from agent.protocol import PollReply
from agent.work import Outgoing, Work

# How long a result waits for the held poll to come back and the next poll to carry it:
# under load polls come back within milliseconds, and a result that rides one costs no request.
COURIER_GRACE_SECONDS = 0.02


class Sender(Protocol):
    """The agent, for the courier: the poll beside the held one, its answer, and the wait for
    the jobs just started to end too."""

    def beside(self, runs: list[JobRun]) -> Outgoing: ...

    def answered(self, reply: PollReply, outgoing: Outgoing) -> None: ...

    def settle(self) -> None: ...


class Courier:
    def __init__(self, work: Work, controller: remote.Controller, log: Log, sender: Sender) -> None:
        self.work = work
        self.controller = controller  # its own connection, beside the loop's
        self.log = log
        self.sender = sender
        self.queue: list[tuple[JobRun, int | None]] = []  # (run, the poll it waits for)
        self.wake = threading.Event()
        self.gone: str | None = None  # the controller said the machine is gone

    def take(self, run: JobRun, poll: int | None) -> None:
        """Under the lock: ``run``'s result is the courier's, to send unless the held poll
        ``poll`` comes back first (None: a large result or a cancel, sent at once)."""
        run.sending = True
        self.queue.append((run, poll))
        self.wake.set()

    def deliver(self) -> None:
        """The thread: sends what it is given until the agent finishes."""
        work = self.work
        while not work.finished.is_set():
            self.wake.wait(1.0)
            self.wake.clear()
            while runs := self._due():
                self.send(runs)

    def _due(self) -> list[JobRun]:
        """The runs to send now, the queue emptied: once the held poll a result waits for is
        out past its grace (or, under a full machine's, past the settle); those whose poll
        came back meanwhile are the loop's again, for its next poll to carry."""
        work = self.work
        with work.lock:
            waiting = [poll for _, poll in self.queue if poll is not None]
            if waiting and not self._held_on(waiting[0]):
                for run, poll in self.queue:
                    if poll is not None:
                        run.sending = False
                self.queue = [(run, poll) for run, poll in self.queue if poll is None]
                work.wake.set()
            runs = [run for run, _ in self.queue]
            self.queue.clear()
            return runs

    def _held_on(self, poll: int) -> bool:
        """Under the lock: wait up to the grace for the held poll ``poll`` to come back when
        it offers a slot (it may come back with work, and the next poll carry the result),
        else for the jobs just started to end too (``settle``); True if a poll is still out
        then (that one, or a later one that does not carry the result)."""
        work = self.work
        if work.offered == 0:
            self.sender.settle()
            return work.holding
        ends = time.monotonic() + COURIER_GRACE_SECONDS
        while work.holding and work.polls == poll and not work.finished.is_set():
            left = ends - time.monotonic()
            if left <= 0:
                break
            work.lock.wait(left)
        return work.holding

    def send(self, runs: list[JobRun]) -> None:
        """``runs``' results on a poll beside the held one (a large one on its own)."""
        work = self.work
        with work.lock:
            work.besides += 1
        try:
            outgoing = self.sender.beside(runs)
            if outgoing.carried:
                self._poll(outgoing)
        finally:
            with work.lock:
                work.besides -= 1
        for run in runs:
            if run not in outgoing.carried:
                self.post(run)

    def _poll(self, outgoing: Outgoing) -> None:
        outgoing.sent = time.monotonic()
        try:
            reply = self.controller.poll(outgoing.request, timeout=outgoing.timeout)
        except ControllerError as exc:
            self._failed(outgoing.carried, exc)
        else:
            self.sender.answered(reply, outgoing)

    def post(self, run: JobRun) -> None:
        """One result on its own (too large to ride a poll)."""
        assert run.report is not None
        report = dataclasses.replace(run.report, posted=run.posted())
        try:
            answer = self.controller.result(run.job, run.attempt, report)
        except Refused as exc:
            self.log("result_refused", job=run.job, attempt=run.attempt, reason=exc)
            self.work.forget(run)
            return
        except ControllerError as exc:
            self._failed([run], exc)
            return
        self.work.last_contact = time.monotonic()
        self.log("result", job=run.job, attempt=run.attempt, status=answer.job_status)
        self.work.forget(run)

    def _failed(self, runs: list[JobRun], exc: ControllerError) -> None:
        """Not delivered: gone (the agent leaves), or held for the next poll to carry."""
        if isinstance(exc, Gone):
            self.gone = str(exc)
        else:
            with self.work.lock:
                for run in runs:
                    self.log("result_held", job=run.job, attempt=run.attempt, reason=exc)
                    run.sending = False  # the next poll carries it
        self.work.wake.set()
