"""The agent's loop: join, start the backend, report ready, then poll for work, run jobs,
renew their leases with the polls (each lease once it is a moment old: leases.renewal_due),
and deliver results until the controller has them.

Logs go to stdout, one line an event: ``agent machine=NAME event=EVENT key=value ...``.
Exit codes: 0 drained or told to leave, 1 stopped by a second signal, 2 bad settings,
3 join or rejoin refused (401: a used, expired or forged token, an unknown machine, another
credential; 410: the machine is failed or destroyed) after running the poweroff command,
4 the backend never became ready (or its image never arrived), 5 the backend could not be
restarted, 6 out of contact with the controller for too long, 7 the controller could not be
reached to join within JOIN_BUDGET_SECONDS (transient: systemd starts the agent again).
The unit (cloud-init/sp00ky-agent.service) restarts none of 3 and 4: a VM never loops.

The first join issues a machine credential, kept in ``settings.credential_file`` (0600, never
logged); an agent that finds it there rejoins with it instead of its one-time join token.

When the controller serves another agent than this one, the agent upgrades itself once it
runs no job (``agent.upgrade``): it takes no new work meanwhile, then replaces its process
with the new agent, which rejoins as the same machine.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import controller as remote
from agent import http_headers, upgrade
from agent.backend import Backend
from agent.clock import Monotonic
from agent.courier import Courier
from agent.credentials import Credentials
from agent.errors import ControllerError, Gone, Refused, SettingsError, Unreachable
from agent.jobs import JobRun, Slots
from agent.leases import bounded_timeout, renewal_due, safety_margin
from agent.logs import log
from agent.protocol import (
    AgentSettings,
    Assignment,
    FinishedAttempt,
    JoinReply,
    PollReply,
    PollRequest,
    ResultRequest,
    RunningAttempt,
)
from agent.settings import Settings
from agent.watchdog import Watchdog
from agent.work import Outgoing, Work

JOIN_BUDGET_SECONDS = 600.0
REFUSED = 3  # the unit's RestartPreventExitStatus lists it: a refused machine stays off
UNREACHABLE = 7  # no answer to join within the budget: the unit restarts the agent
# Results a poll may carry in all, as JSON: well under the controller's 256 KiB for a poll's
# body (controller/limits.py); a larger result is posted on its own (up to 1 MiB).
POLL_RESULTS_BYTES = 128 * 1024
# An upgrade's fetch of the agent archive (tens of KiB) may take this long, or a third of the
# lease if longer: no job runs meanwhile.
HTTP_FETCH_SECONDS = 30.0
# A poll that would carry results first waits this long for the jobs the last poll started,
# so that it carries their results too rather than leave them to the poll after.
SETTLE_SECONDS = 0.008


class Agent:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.machine = settings.machine
        self.remote = remote.Controller(settings.controller_url, settings.machine)
        self.work = Work()
        self.slots = Slots()  # the threads that POST the jobs, each with its connection
        self.stopping = 0  # signals received: 1 drains, 2 stops at once
        self.draining = False
        self.recycle_due = False
        self.failures = 0  # polls failed in a row: their backoff
        self.credentials = Credentials(settings.credential_file, self.log)
        self.backend = Backend(settings, self.remote, self.log)
        courier = remote.Controller(settings.controller_url, settings.machine)
        self.courier = Courier(self.work, courier, self.log, self)
        self.watchdog = Watchdog(self.work, self.backend, self.log)
        home = upgrade.home_of(settings.agent_home)
        self.upgrade = upgrade.Upgrade(home, upgrade.own_sha256(home), self.log, Monotonic())
        self.taking = True  # False while a due upgrade waits for the jobs running to end
        self.credential: str | None = None  # the machine's, for a restart that keeps it
        self.execute = upgrade.execute  # replaces the process (a test's stand-in returns)

    # --- lifecycle -------------------------------------------------------------------------

    def log(self, event: str, **fields: Any) -> None:
        log(self.machine, event, **fields)

    def on_signal(self, signum: int, _: Any) -> None:
        self.stopping += 1
        self.log("signal", signal=signal.Signals(signum).name, stopping=self.stopping)
        self.work.wake.set()

    def run(self) -> int:
        self.backend.prepare()  # the Docker engine is looked for while the join is out
        credential = self.credentials.read()
        how = "rejoin" if credential else "join"
        try:
            joined = self.join(credential)
        except (Refused, Gone) as exc:
            # Final: a used or expired token, another credential, a failed or destroyed
            # machine. Powered off (on a VM) and an exit the unit does not restart: no loop.
            self.log(f"{how}_refused", status=exc.status, reason=exc, next="poweroff")
            self.power_off()
            return REFUSED
        except Unreachable as exc:
            self.log(f"{how}_unreachable", reason=exc, next="exit")
            return UNREACHABLE
        # The credential is written (and synced) beside the image's fetch, not before it,
        # and is on disk before the agent says ready or leaves.
        saving = threading.Thread(target=self.keep, args=(joined.credential,), name="credential")
        saving.start()
        self.config: AgentSettings = joined.settings
        self.work.lease, self.work.margin = self.config.lease, safety_margin(self.config.lease)
        self.credential = joined.credential or credential
        self.upgrade.served(joined.agent, first_join=not credential)
        backend = joined.backend
        self.log(
            f"{how}ed",
            pool=joined.pool,
            backend=backend.name,
            slots=self.config.slots,
            agent=self.upgrade.own,
        )
        try:
            problem = self.backend.boot(backend, joined.pool, self.config.boot_timeout)
        finally:
            saving.join()
        if problem:
            self.log("boot_failed", reason=problem)
            self.call(lambda: self.remote.ready(False, problem))
            self.backend.stop()
            return 4
        self.call(lambda: self.remote.ready(True))
        self.log("ready", backend=self.backend.describe())
        self.start_threads()
        try:
            return self.loop()
        finally:
            self.stop_threads()
            for run in list(self.work.runs.values()):
                run.stop("shutdown")
            self.backend.stop()

    def keep(self, credential: str | None) -> None:
        """The machine credential a first join issued, kept to rejoin with (a rejoin has
        none to keep)."""
        if credential:
            self.credentials.save(credential)

    def join(self, credential: str | None = None) -> JoinReply:
        """Join with the one-time token, or rejoin with the machine credential when there is
        one; transient failures (unreachable, 5xx, 503 not the leader) are retried with
        backoff; Refused and Gone are final."""
        started, attempt = time.monotonic(), 0
        how = "rejoin" if credential else "join"
        while True:
            try:
                if credential:
                    reply = self.remote.rejoin(credential, self.upgrade.own)
                else:
                    reply = self.remote.join(self.settings.join_token, self.upgrade.own)
                self.work.last_contact = time.monotonic()
                return reply
            except (Refused, Gone):
                raise
            except ControllerError as exc:
                if time.monotonic() - started > JOIN_BUDGET_SECONDS:
                    raise Unreachable(
                        f"could not {how} in {JOIN_BUDGET_SECONDS:.0f}s: {exc}"
                    ) from exc
                pause = remote.backoff(attempt)
                self.log(f"{how}_retry", reason=exc, wait=f"{pause:.2f}")
                time.sleep(pause)
                attempt += 1

    def call(self, action: Any) -> Any:
        """One request to the controller; contact is noted, errors are logged and None."""
        try:
            result = action()
            self.work.last_contact = time.monotonic()
            return result
        except Gone:
            raise
        except ControllerError as exc:
            self.log("controller_error", reason=exc)
            return None

    def start_threads(self) -> None:
        self.courier.controller.session_token = self.remote.session_token
        for target, name in ((self.watchdog.watch, "watchdog"), (self.courier.deliver, "courier")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def stop_threads(self) -> None:
        self.work.finished.set()
        self.courier.wake.set()
        with self.work.lock:
            self.work.lock.notify_all()

    def power_off(self) -> None:
        """Out of contact too long, or refused: stop the backend and, on a VM, power the
        machine off (with no poweroff command, a local machine, the agent only exits)."""
        self.backend.stop()
        if not self.settings.poweroff:
            self.log("poweroff_skipped", reason="no poweroff command")
            return
        self.log("poweroff", command=" ".join(self.settings.poweroff))
        try:
            subprocess.run(list(self.settings.poweroff), check=False, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.log("poweroff_failed", reason=exc)

    # --- the loop: one poll a pass ---------------------------------------------------------

    def loop(self) -> int:
        """Poll until the agent leaves (its exit code): each pass sees whether to end, keeps
        the backend up, sends a poll with the finished results and takes its answer."""
        while True:
            code = self.ending()
            if code is None:
                self.upgrading()  # before a recycle: an upgrade restarts the backend anyway
                code = self.keep_backend()
            if code is not None:
                return code
            outgoing = self.outgoing()
            reply = self.send(outgoing)
            if isinstance(reply, int):
                return reply
            if reply is None:
                continue
            self.received(reply, outgoing)
            self.pause(reply, outgoing)

    def ending(self) -> int | None:
        """The exit code when the agent leaves now: a second signal, a machine gone, or a
        drain finished (a first signal starts one)."""
        if self.stopping >= 2:
            self.log("stopped", reason="second signal")
            return 1
        if self.courier.gone is not None:
            self.log("gone", reason=self.courier.gone)
            return 0
        if self.stopping == 1 and not self.draining:
            self.draining = True
            self.log("draining", reason="signal")
        if self.draining and not self.work.runs:
            self.call(self.remote.drained)
            self.log("drained")
            return 0
        return None

    def keep_backend(self) -> int | None:
        """Restart an idle backend that exited or is due a recycle; 5 if it cannot be."""
        with self.work.lock:
            # a poll beside the held one may be bringing a job: not idle until it is in
            idle = not self.work.running() and not self.work.besides
            idle = idle and self.backend.runtime is not None
        if idle and (self.recycle_due or not self.backend.alive()):
            why = "recycle" if self.recycle_due else "the backend exited"
            self.recycle_due = False
            if not self.backend.restart(why):
                return 5
        return None

    def outgoing(self) -> Outgoing:
        """The next poll: the results it carries, the attempts still running (the leases due
        a renewal), the free slots and how long it may be held."""
        work = self.work
        alive = not self.draining and self.taking and self.backend.alive()
        with work.lock:
            carried = self._carried()
            busy = len(work.occupied())
            free = max(0, self.config.slots - busy) if alive else 0
            now = time.monotonic()
            give_up = work.give_up_at()
            # Held while a slot is free (for work) or a job runs (so a kill reaches it at
            # once); a draining machine's polls are answered at once anyway.
            held = free > 0 or (busy > 0 and not self.draining)
            wait = self.config.poll_wait if held else 0.0
            if give_up is not None:  # a held poll must answer well before then
                wait = min(wait, max(0.0, (give_up - now) / 2))
            work.holding, work.offered = wait > 0, free
            work.polls += 1
            reported = self._reported(carried, now, lambda run: True)
        timeout = bounded_timeout(wait + remote.HTTP_SLACK_SECONDS, now, give_up)
        refill = self._refills(alive)
        results = tuple(_finished(run) for run in carried)
        request = PollRequest(
            running=reported, free_slots=free, wait=wait, refill=refill, results=results
        )
        return Outgoing(request, carried, alive, timeout)

    def beside(self, runs: list[JobRun]) -> Outgoing:
        """The courier's poll beside the held one, answered at once: the results of ``runs``
        that fit (and of other finished runs no poll carries), the attempts still running,
        and the free slots, for work in the slots these results free. When these slots take
        no work now (``refill`` false: the backend restarts between jobs first, or no work is
        taken), it offers none, and the controller answers the held poll instead."""
        work = self.work
        alive = not self.draining and self.taking and self.backend.alive()
        refill = self._refills(alive)
        with work.lock:
            carried = self._carried(runs)
            busy = len(work.occupied())
            free = max(0, self.config.slots - busy) if refill else 0
            now = time.monotonic()
            give_up = work.give_up_at()
            # a result the held poll carries is not reported running beside it
            reported = self._reported(carried, now, lambda run: not run.done.is_set())
        timeout = bounded_timeout(remote.HTTP_SLACK_SECONDS, now, give_up)
        results = tuple(_finished(run) for run in carried)
        request = PollRequest(
            running=reported, free_slots=free, refill=refill, beside=True, results=results
        )
        return Outgoing(request, carried, alive, timeout)

    def _refills(self, alive: bool) -> bool:
        """Whether a slot a job frees while a poll is held takes work at once: not when the
        backend restarts between jobs first (its pool's recycle, or a restart due once no
        job runs) or no work is taken now (``alive`` false)."""
        return alive and self.config.recycle != "job" and not self.recycle_due

    def _reported(
        self, carried: list[JobRun], now: float, held: Callable[[JobRun], bool]
    ) -> tuple[RunningAttempt, ...]:
        """Under the lock: the attempts a poll reports running (``held``), neither carried
        nor killed (a killed one's cancel is on its way), each fresh or due a renewal."""
        return tuple(
            RunningAttempt(
                job=run.job,
                attempt=run.attempt,
                posted=run.posted(),
                fresh=not renewal_due(run.renewed_at, now, self.config.lease),
            )
            for run in self.work.runs.values()
            if run not in carried and run.stopped is None and held(run)
        )

    def _carried(self, taken: list[JobRun] | None = None) -> list[JobRun]:
        """Under the lock: the finished results a poll carries, the courier's ``taken``
        first, as many small ones as fit. A large one of the others goes to the courier, on
        its own POST; one of ``taken`` is left to the courier, which posts it."""
        ended = [
            run
            for run in self.work.runs.values()
            if run.done.is_set() and run.report is not None and not run.sending
        ]
        carried: list[JobRun] = []
        space = POLL_RESULTS_BYTES
        for run in [*(taken or ()), *ended]:
            if run.report_bytes <= space:
                carried.append(run)
                space -= run.report_bytes
            elif taken is None or run not in taken:
                self.courier.take(run, None)
        for run in carried:
            run.sending = True
        return carried

    def send(self, outgoing: Outgoing) -> PollReply | int | None:
        """The poll sent: its answer, an exit code (gone, or out of contact too long), or
        None to try again after a backoff."""
        outgoing.sent = self.work.poll_sent = time.monotonic()
        try:
            return self.remote.poll(outgoing.request, timeout=outgoing.timeout)
        except Gone as exc:
            self.log("gone", reason=exc)
            return 0
        except ControllerError as exc:
            return self._poll_failed(outgoing, exc)

    def _poll_failed(self, outgoing: Outgoing, exc: ControllerError) -> int | None:
        work = self.work
        with work.lock:
            work.holding = False
            for run in outgoing.carried:
                run.sending = False
            work.lock.notify_all()
        if time.monotonic() - work.last_contact > self.config.max_offline:
            self.log("offline", reason=f"no contact for {self.config.max_offline}s")
            self.power_off()
            return 6
        pause = remote.backoff(self.failures)
        self.failures += 1
        self.log("poll_error", reason=exc, wait=f"{pause:.2f}")
        work.wake.wait(pause)
        work.wake.clear()
        return None

    def received(self, reply: PollReply, outgoing: Outgoing) -> None:
        """The answer: the results it acknowledged, the leases it renewed, stops and work."""
        self.failures = 0
        with self.work.lock:
            self.work.holding = False
            self.work.lock.notify_all()
        self.answered(reply, outgoing)

    def answered(self, reply: PollReply, outgoing: Outgoing) -> None:
        """A poll's answer (the loop's, or the courier's beside the held one) taken in."""
        self.work.last_contact = outgoing.sent
        self.acknowledged(reply, outgoing.carried)
        reported = outgoing.request.running
        renewing = {(each.job, each.attempt) for each in reported if not each.fresh}
        self.handle(reply, outgoing.sent, renewing)

    def pause(self, reply: PollReply, outgoing: Outgoing) -> None:
        """Between polls: after a held poll, or work taken into a free slot, poll again at
        once (a held poll is how kills and work arrive); after one not held, soon for
        renewals, or at once when a job ends. A finished job's result waits for the jobs just
        started (``settle``)."""
        work = self.work
        with work.lock:
            finished = any(
                run.done.is_set() and run.report is not None and not run.sending
                for run in work.runs.values()
            )
            room = outgoing.alive and not self.draining and self.config.slots > len(work.runs)
        if not finished and not (outgoing.request.wait > 0 or (room and reply.assignments)):
            work.wake.wait(min(1.0, self.config.lease / 6))
        elif finished:
            self.settle()
        work.wake.clear()

    def settle(self) -> None:
        """Wait until every job started less than SETTLE_SECONDS ago has ended, or that
        long after it started, whichever is first (a signal or a stop ends it at once)."""
        work = self.work
        with work.lock:
            while self.stopping == 0 and self.courier.gone is None:
                now = time.monotonic()
                fresh = [
                    run.assigned_at + SETTLE_SECONDS
                    for run in work.running()
                    if now < run.assigned_at + SETTLE_SECONDS
                ]
                if not fresh:
                    return
                work.lock.wait(max(fresh) - now)

    # --- the upgrade -----------------------------------------------------------------------

    def upgrading(self) -> None:
        """While an upgrade is due: no new work until the jobs held end (for at most a lease),
        then the upgrade and a restart into it (the process replaced), or its failure
        (logged, tried again after a backoff). Never while the agent drains or stops."""
        if self.draining or self.stopping:
            self.taking = True
            return
        with self.work.lock:
            busy = len(self.work.runs)
        step = self.upgrade.step(busy, self.config.lease)
        self.taking = step == "claim"
        if step != "go":
            return
        env = self.restart_env()
        if env is not None:
            timeout = max(HTTP_FETCH_SECONDS, self.config.lease / 3)
            if self.upgrade.attempt(lambda: self.fetch_agent(timeout)) is not None:
                self.restart(env)
        self.taking = True

    def fetch_agent(self, timeout: float) -> bytes:
        archive: bytes = self.remote.agent_archive(timeout)
        self.work.last_contact = time.monotonic()
        return archive

    def restart_env(self) -> dict[str, str] | None:
        """The environment the upgraded agent runs with, its machine credential on disk where
        it reads it; None (the upgrade tried again later) when it is not: the new agent could
        not rejoin."""
        home, target = self.upgrade.home, self.upgrade.target
        assert home is not None and target is not None
        env = upgrade.restart_env(os.environ, home, target)
        kept = self.settings.credential_file
        if not kept and self.credential:  # no credential file: kept beside the releases
            kept = env["SPKY_AGENT_CREDENTIAL_FILE"] = str(home / "credential")
            Credentials(kept, self.log).save(self.credential)
        if not kept or not Path(kept).is_file():
            self.upgrade.later("upgrade_failed", "the machine credential is not on disk")
            return None
        return env

    def restart(self, env: dict[str, str]) -> None:
        """Replace this process with the upgraded agent, the backend stopped first."""
        self.backend.stop()
        self.log("upgrade_restart", release=env[upgrade.RELAUNCHED])
        try:
            self.execute(env)
        except OSError as exc:  # the loop starts the backend again (keep_backend)
            self.upgrade.later("upgrade_failed", f"cannot restart into it: {exc}")

    # --- the answer ------------------------------------------------------------------------

    def acknowledged(self, reply: PollReply, carried: list[JobRun]) -> None:
        """The results the poll carried: recorded or refused are done with; any the answer
        does not name go again on the next poll."""
        acks = {(ack.job, ack.attempt): ack for ack in reply.results}
        for run in carried:
            ack = acks.get((run.job, run.attempt))
            if ack is None:
                with self.work.lock:
                    run.sending = False
                continue
            if ack.refused is not None:
                self.log("result_refused", job=run.job, attempt=run.attempt, reason=ack.refused)
            else:
                self.log("result", job=run.job, attempt=run.attempt, status=ack.job_status)
            self.work.forget(run)

    def handle(self, reply: PollReply, sent: float, renewing: set[tuple[str, str]]) -> None:
        """The answer to the poll sent at ``sent``, which asked to renew the leases of the
        attempts in ``renewing``: those it did not stop count as renewed then."""
        stopped = {stop.job for stop in reply.stop}
        with self.work.lock:
            for run in self.work.runs.values():
                if run.job not in stopped and (run.job, run.attempt) in renewing:
                    run.renewed_at = max(run.renewed_at, sent)  # this poll renewed its lease
            self.work.lock.notify_all()
        for stop in reply.stop:
            stopping = self.work.runs.get(stop.job)
            if stopping is None or stopping.attempt != stop.attempt:
                continue
            self.log("stop", job=stopping.job, attempt=stopping.attempt, reason=stop.reason)
            self.drop(stopping, stop.reason)
        for work in reply.assignments:
            self.take_work(work, sent)
        # no agent named: the controller serves the one this machine runs (rolled back, say)
        self.upgrade.served(reply.agent or self.upgrade.own)
        if reply.drain and not self.draining:
            self.draining = True
            self.log("draining", reason="controller")

    def take_work(self, work: Assignment, sent: float) -> None:
        """Run an assignment (one sent again after a lost answer runs already, or ended: two
        answers, the loop's and the courier's, may bring it)."""
        with self.work.lock:
            known = self.work.runs.get(work.job)
            if known is not None and known.attempt == work.attempt:
                return
            if work.attempt in self.work.ended:
                return
            run = JobRun(
                job=work.job,
                attempt=work.attempt,
                path=work.path,
                payload=work.payload,
                deadline=work.deadline,
                renewed_at=sent,
                margin=self.work.margin,
            )
            self.work.runs[run.job] = run
            self.work.lock.notify_all()
        # The POST goes out from this thread where it can (Slots.start), then the log
        done = functools.partial(self.job_done, run)
        self.slots.start(run, self.backend.port, done, post_here=True)
        self.log("job_start", job=run.job, attempt=run.attempt, path=run.path)

    def drop(self, run: JobRun, reason: str) -> None:
        """Stop a job: close its request's connection (the backend sees its client gone) and,
        when it was the only job, restart the backend so the work really stops. A killed job
        is reported cancelled at once, by the courier, beside any held poll: the controller
        frees its slot then; other stopped jobs are forgotten."""
        work = self.work
        with work.lock:
            alone = len(work.running()) == 1 and not run.done.is_set()
        run.stop(reason)
        with work.lock:
            if reason == "cancelled":
                run.report = ResultRequest(status="cancelled")
                if not run.sending:
                    self.courier.take(run, None)
            elif work.runs.get(run.job) is run:
                del work.runs[run.job]
        if alone and self.backend.runtime is not None:
            self.recycle_due = True
        work.wake.set()

    def job_done(self, run: JobRun) -> None:
        """A job's thread ended: its result rides the loop's next poll, which this wakes. If a
        long-poll is out, the courier takes it unless that poll comes back within the grace."""
        work = self.work
        with work.lock:
            if run.report is not None and run.report.status != "cancelled":
                if self.config.recycle == "job":
                    self.recycle_due = True
                if work.holding and not run.sending and work.runs.get(run.job) is run:
                    self.courier.take(run, work.polls)
            work.lock.notify_all()
        work.wake.set()


def _finished(run: JobRun) -> FinishedAttempt:
    report = run.report
    assert report is not None
    return FinishedAttempt(
        job=run.job,
        attempt=run.attempt,
        status=report.status,
        result=report.result,
        error=report.error,
        posted=run.posted(),
    )


def main() -> int:
    http_headers.install()  # answers' headers without the email package (http_headers)
    try:
        settings = Settings.load()
    except SettingsError as exc:
        print(f"agent: {exc}", file=sys.stderr)
        return 2
    if not Path(settings.workdir).is_dir():
        print(f"agent: SPKY_AGENT_WORKDIR {settings.workdir} is not a directory", file=sys.stderr)
        return 2
    upgrade.relaunch(settings.agent_home, functools.partial(log, settings.machine))
    agent = Agent(settings)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, agent.on_signal)
    try:
        code = agent.run()
    except Gone as exc:
        agent.log("gone", reason=exc)
        code = 0
    agent.log("exit", code=code)
    return code
