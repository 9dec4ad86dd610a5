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
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from agent import controller as remote
from agent import http_headers
from agent.docker import DockerAPI, DockerRuntime
from agent.errors import (
    ControllerError,
    Gone,
    ImageUnavailable,
    Refused,
    RuntimeError_,
    SettingsError,
    Unreachable,
)
from agent.images import Transient, ensure_image
from agent.jobs import JobRun, Slots
from agent.leases import abandon_at, bounded_timeout, renewal_due, safety_margin, watch_pause
from agent.protocol import (
    AgentSettings,
    BackendInfo,
    FinishedAttempt,
    JoinReply,
    PollReply,
    PollRequest,
    ResultRequest,
    RunningAttempt,
)
from agent.runtime import ProcessRuntime, Runtime, wait_ready
from agent.settings import Settings

JOIN_BUDGET_SECONDS = 600.0
REFUSED = 3  # the unit's RestartPreventExitStatus lists it: a refused machine stays off
UNREACHABLE = 7  # no answer to join within the budget: the unit restarts the agent
# Results a poll may carry in all, as JSON: well under the controller's 256 KiB for a poll's
# body (controller/limits.py); a larger result is posted on its own (up to 1 MiB).
POLL_RESULTS_BYTES = 128 * 1024
# A result that ends while a poll is out waits this long for that poll to come back and the
# next to carry it; only a poll still held then (a long-poll with nothing to say) leaves it to
# the courier. Under load polls come back within a few milliseconds with work, so results
# ride them instead of costing the controller a request each.
COURIER_GRACE_SECONDS = 0.02
# A poll that would carry results first waits this long for the jobs the last poll started,
# so that it carries their results too rather than leave them to the poll after.
SETTLE_SECONDS = 0.008


# Reentrant: the signal handler logs (Agent.on_signal), and runs in the main thread, which
# may be inside log() at that moment (a write to a full pipe waits, and is where the handler
# runs): a plain lock there waits on itself for ever and the agent never drains.
_LOG_LOCK = threading.RLock()


def log(machine: str, event: str, **fields: Any) -> None:
    """One line on stdout, written whole: the line and its newline in one write, one thread
    at a time. The agent runs unbuffered (PYTHONUNBUFFERED, as its unit, image and local
    machines start it), where ``print`` writes the text and the newline apart, and lines
    of two threads (the poll loop, the courier, the watchdog) ran together."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    extra = " ".join(f"{key}={value}" for key, value in fields.items() if value is not None)
    line = f"{stamp} agent machine={machine} event={event} {extra}".rstrip() + "\n"
    with _LOG_LOCK:
        sys.stdout.write(line)
        sys.stdout.flush()


class Agent:
    def __init__(self, settings: Settings, runtime_factory: Any = None) -> None:
        self.settings = settings
        self.machine = settings.machine
        self.remote = remote.Controller(settings.controller_url, settings.machine)
        self.runs: dict[str, JobRun] = {}  # by job id: running, or finished and unreported
        self.slots = Slots()  # the threads that POST the jobs, each with its connection
        self.wake = threading.Event()
        self.stopping = 0  # signals received: 1 drains, 2 stops at once
        self.draining = False
        self.recycle_due = False
        self.last_contact = time.monotonic()
        self.runtime: Runtime | None = None
        self.runtime_factory = runtime_factory or self._process_runtime
        self.lock = threading.Condition()  # the runs, their renewals, who sends a result
        self.holding = False  # a long-poll is out: a result that ends now may go by courier
        self.poll_sent = time.monotonic()  # the last poll's send time (leases.watch_pause)
        self.polls = 0  # polls sent: the courier's grace ends when the held one came back
        self.courier = remote.Controller(settings.controller_url, settings.machine)
        # (run, the poll it waits for, or None: a large result, posted at once)
        self.courier_queue: list[tuple[JobRun, int | None]] = []
        self.courier_wake = threading.Event()
        self.backend_lock = threading.RLock()  # the watchdog may stop it; the loop starts it
        self.finished = threading.Event()
        self.gone: str | None = None  # the courier was told the machine is gone

    # --- lifecycle -------------------------------------------------------------------------

    def log(self, event: str, **fields: Any) -> None:
        log(self.machine, event, **fields)

    def on_signal(self, signum: int, _: Any) -> None:
        self.stopping += 1
        self.log("signal", signal=signal.Signals(signum).name, stopping=self.stopping)
        self.wake.set()

    def run(self) -> int:
        credential = self.read_credential()
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
        if joined.credential:
            self.save_credential(joined.credential)
        self.backend: BackendInfo = joined.backend
        self.pool = joined.pool
        self.config: AgentSettings = joined.settings
        self.margin = safety_margin(self.config.lease)
        self.log(f"{how}ed", pool=joined.pool, backend=self.backend.name, slots=self.config.slots)
        try:
            problem = self.start_backend()
        except RuntimeError_ as exc:
            problem = str(exc)
        if problem:
            self.log("boot_failed", reason=problem)
            self.call(lambda: self.remote.ready(False, problem))
            self.stop_backend()
            return 4
        self.call(lambda: self.remote.ready(True))
        self.log("ready", backend=self.runtime.describe() if self.runtime else None)
        self.start_threads()
        try:
            return self.loop()
        finally:
            self.stop_threads()
            for run in list(self.runs.values()):
                run.stop("shutdown")
            self.stop_backend()

    def join(self, credential: str | None = None) -> JoinReply:
        """Join with the one-time token, or rejoin with the machine credential when there is
        one; transient failures (unreachable, 5xx, 503 not the leader) are retried with
        backoff; Refused and Gone are final."""
        started, attempt = time.monotonic(), 0
        how = "rejoin" if credential else "join"
        while True:
            try:
                if credential:
                    reply = self.remote.rejoin(credential)
                else:
                    reply = self.remote.join(self.settings.join_token)
                self.last_contact = time.monotonic()
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

    def read_credential(self) -> str | None:
        """The machine credential of an earlier join, if this machine kept one."""
        path = self.settings.credential_file
        if not path:
            return None
        try:
            credential = Path(path).read_text().strip()
        except FileNotFoundError:
            self.log("credential_none", path=path, next="join")
            return None
        except OSError as exc:
            self.log("credential_unreadable", path=path, reason=exc, next="join")
            return None
        if not credential:
            self.log("credential_none", path=path, next="join")
            return None
        self.log("credential_found", path=path, next="rejoin")
        return credential

    def save_credential(self, credential: str) -> None:
        """Kept 0600 beside the settings (written whole, then renamed into place); never in
        the log. Unsaved, the machine still works but cannot rejoin after a reboot."""
        path = self.settings.credential_file
        if not path:
            self.log("credential_unsaved", reason="no credential_file setting")
            return
        target = Path(path)
        temporary = target.with_name(f".{target.name}.tmp")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as file:
                file.write(credential + "\n")
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, target)
        except OSError as exc:
            self.log("credential_unsaved", path=path, reason=exc)
            return
        self.log("credential_saved", path=path)

    def call(self, action: Any) -> Any:
        """One request to the controller; contact is noted, errors are logged and None."""
        try:
            result = action()
            self.last_contact = time.monotonic()
            return result
        except Gone:
            raise
        except ControllerError as exc:
            self.log("controller_error", reason=exc)
            return None

    # --- the backend -----------------------------------------------------------------------

    def _process_runtime(self, backend: BackendInfo) -> Runtime:
        if self.settings.runtime == "docker":
            api = DockerAPI(self.settings.docker_socket)
            image = self.settings.image or self.fetch_image(api, backend)
            if not image:
                raise RuntimeError_("the docker runtime needs an image (SPKY_AGENT_IMAGE)")
            labels = {"sp00ky/machine": self.machine, "sp00ky/pool": self.pool}
            return DockerRuntime(
                image=image,
                env=backend.env,
                container_port=backend.port or 8080,
                labels={**labels, "sp00ky/role": "backend"},
                name=f"sp00ky-{self.machine}-backend",
                api=api,
            )
        command = list(self.settings.command or backend.command)
        return ProcessRuntime(
            command, backend.env, self.settings.workdir, inherit=self.settings.inherit_env
        )

    def fetch_image(self, api: DockerAPI, backend: BackendInfo) -> str | None:
        """The backend's image onto this machine's engine before it starts (ImageError, a
        failed boot naming the image, if it cannot be had)."""
        if backend.image_source is None:
            return backend.image
        deadline = time.monotonic() + self.config.boot_timeout
        return ensure_image(api, backend.image_source, self._image_stream, self.log, deadline)

    def _image_stream(self, image_id: str) -> Any:
        try:
            return self.remote.image(image_id)
        except Gone:
            raise
        except Refused as exc:
            raise ImageUnavailable(f"image {image_id}: the controller refused it: {exc}") from exc
        except ControllerError as exc:
            raise Transient(str(exc)) from exc

    def start_backend(self) -> str | None:
        with self.backend_lock:
            if self.runtime is None:
                self.runtime = self.runtime_factory(self.backend)
            assert self.runtime is not None
            self.runtime.start()
            deadline = time.monotonic() + self.config.boot_timeout
            return wait_ready(self.runtime, self.backend.healthcheck, deadline)

    def stop_backend(self) -> None:
        with self.backend_lock:
            if self.runtime is not None:
                self.runtime.stop()

    def runtime_alive(self) -> bool:
        with self.backend_lock:
            return self.runtime is not None and self.runtime.alive()

    def restart_backend(self, why: str) -> bool:
        self.log("backend_restart", reason=why)
        self.stop_backend()
        try:
            problem = self.start_backend()
        except RuntimeError_ as exc:
            problem = str(exc)
        if problem:
            self.log("backend_down", reason=problem)
            return False
        return True

    # --- the loop --------------------------------------------------------------------------
    #
    # Three threads talk to the controller or act on leases; ``self.lock`` guards the runs,
    # their renewals and which sender owns a result:
    # - the loop polls: it carries finished results, renews the leases and takes new work in
    #   one round trip (a held long-poll when slots are free, a quick one when busy);
    # - the courier posts a result at once when the job ends while a long-poll is held, so a
    #   result never waits for the poll to return (milliseconds, whatever the slots and lease);
    # - the watchdog gives a job up on its own clock, before the controller can count its
    #   lease as expired, whatever any network call is doing (a silent partition blocks
    #   calls; it cannot delay the watchdog).

    def running(self) -> list[JobRun]:
        return [run for run in self.runs.values() if not run.done.is_set()]

    def give_up_at(self) -> float | None:
        """The monotonic time the first running job is given up, if any runs (under lock)."""
        points = [
            abandon_at(run.renewed_at, self.config.lease, self.margin) for run in self.running()
        ]
        return min(points, default=None)

    def start_threads(self) -> None:
        self.courier.session_token = self.remote.session_token
        for target, name in ((self.watch, "watchdog"), (self.deliver, "courier")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def stop_threads(self) -> None:
        self.finished.set()
        self.courier_wake.set()
        with self.lock:
            self.lock.notify_all()

    def loop(self) -> int:
        failures = 0
        while True:
            if self.stopping >= 2:
                self.log("stopped", reason="second signal")
                return 1
            if self.gone is not None:
                self.log("gone", reason=self.gone)
                return 0
            if self.stopping == 1 and not self.draining:
                self.draining = True
                self.log("draining", reason="signal")
            if self.draining and not self.runs:
                self.call(self.remote.drained)
                self.log("drained")
                return 0
            with self.lock:
                idle = not self.running() and self.runtime is not None
            if idle and (self.recycle_due or not self.runtime_alive()):
                why = "recycle" if self.recycle_due else "the backend exited"
                self.recycle_due = False
                if not self.restart_backend(why):
                    return 5
            alive = not self.draining and self.runtime_alive()
            with self.lock:
                ended = [
                    run
                    for run in self.runs.values()
                    if run.done.is_set() and run.report is not None and not run.sending
                ]
                carried: list[JobRun] = []
                space = POLL_RESULTS_BYTES
                for run in ended:  # small results ride the poll; a large one its own POST
                    if run.report_bytes <= space:
                        carried.append(run)
                        space -= run.report_bytes
                    else:
                        run.sending = True
                        self.courier_queue.append((run, None))
                        self.courier_wake.set()
                for run in carried:
                    run.sending = True
                busy = len(self.runs) - len(carried)
                free = max(0, self.config.slots - busy) if alive else 0
                now = time.monotonic()
                give_up = self.give_up_at()
                wait = self.config.poll_wait if free > 0 else 0.0
                if give_up is not None:  # a held poll must answer well before then
                    wait = min(wait, max(0.0, (give_up - now) / 2))
                self.holding = wait > 0
                self.polls += 1
                lease = self.config.lease
                reported = tuple(
                    RunningAttempt(
                        job=run.job,
                        attempt=run.attempt,
                        posted=run.posted(),
                        fresh=not renewal_due(run.renewed_at, now, lease),
                    )
                    for run in self.runs.values()
                    if run not in carried
                )
            results = tuple(_finished(run) for run in carried)
            timeout = bounded_timeout(wait + remote.HTTP_SLACK_SECONDS, now, give_up)
            request = PollRequest(running=reported, free_slots=free, wait=wait, results=results)
            sent = self.poll_sent = time.monotonic()
            try:
                reply = self.remote.poll(request, timeout=timeout)
            except Gone as exc:
                self.log("gone", reason=exc)
                return 0
            except ControllerError as exc:
                with self.lock:
                    self.holding = False
                    for run in carried:
                        run.sending = False
                    self.lock.notify_all()
                if time.monotonic() - self.last_contact > self.config.max_offline:
                    self.log("offline", reason=f"no contact for {self.config.max_offline}s")
                    self.power_off()
                    return 6
                pause = remote.backoff(failures)
                failures += 1
                self.log("poll_error", reason=exc, wait=f"{pause:.2f}")
                self.wake.wait(pause)
                self.wake.clear()
                continue
            failures = 0
            self.last_contact = sent
            with self.lock:
                self.holding = False
                self.lock.notify_all()
            self.acknowledged(reply, carried)
            renewing = {(each.job, each.attempt) for each in reported if not each.fresh}
            self.handle(reply, sent, renewing)
            with self.lock:
                finished = any(
                    run.done.is_set() and run.report is not None and not run.sending
                    for run in self.runs.values()
                )
                room = alive and not self.draining and self.config.slots > len(self.runs)
            if not finished and not (room and (reply.assignments or wait > 0)):
                # busy (or just filled up): poll again soon for kills and renewals, or at
                # once when a job ends; not straight away for nothing
                self.wake.wait(min(1.0, self.config.lease / 6))
            elif finished:
                self.settle()
            self.wake.clear()

    def settle(self) -> None:
        """Wait until every job started less than SETTLE_SECONDS ago has ended, or that
        long after it started, whichever is first (a signal or a stop ends it at once)."""
        with self.lock:
            while self.stopping == 0 and self.gone is None:
                now = time.monotonic()
                fresh = [
                    run.assigned_at + SETTLE_SECONDS
                    for run in self.running()
                    if now < run.assigned_at + SETTLE_SECONDS
                ]
                if not fresh:
                    return
                self.lock.wait(max(fresh) - now)

    def acknowledged(self, reply: PollReply, carried: list[JobRun]) -> None:
        """The results the poll carried: recorded or refused are done with; any the answer
        does not name go again on the next poll."""
        acks = {(ack.job, ack.attempt): ack for ack in reply.results}
        for run in carried:
            ack = acks.get((run.job, run.attempt))
            if ack is None:
                with self.lock:
                    run.sending = False
                continue
            if ack.refused is not None:
                self.log("result_refused", job=run.job, attempt=run.attempt, reason=ack.refused)
            else:
                self.log("result", job=run.job, attempt=run.attempt, status=ack.job_status)
            self.forget(run)

    def handle(self, reply: PollReply, sent: float, renewing: set[tuple[str, str]]) -> None:
        """The answer to the poll sent at ``sent``, which asked to renew the leases of the
        attempts in ``renewing``: those it did not stop count as renewed then."""
        stopped = {stop.job for stop in reply.stop}
        with self.lock:
            for run in self.runs.values():
                if run.job not in stopped and (run.job, run.attempt) in renewing:
                    run.renewed_at = max(run.renewed_at, sent)  # this poll renewed its lease
            self.lock.notify_all()
        for stop in reply.stop:
            stopping = self.runs.get(stop.job)
            if stopping is None or stopping.attempt != stop.attempt:
                continue
            self.log("stop", job=stopping.job, attempt=stopping.attempt, reason=stop.reason)
            self.drop(stopping, stop.reason)
        for work in reply.assignments:
            known = self.runs.get(work.job)
            if known is not None and known.attempt == work.attempt:
                continue  # sent again after a lost answer: it runs already
            run = JobRun(
                job=work.job,
                attempt=work.attempt,
                path=work.path,
                payload=work.payload,
                deadline=work.deadline,
                renewed_at=sent,
                margin=self.margin,
            )
            with self.lock:
                self.runs[run.job] = run
                self.lock.notify_all()
            assert self.runtime is not None
            # The POST goes out from this thread where it can (Slots.start), then the log
            done = functools.partial(self.job_done, run)
            self.slots.start(run, self.runtime.port, done, post_here=True)
            self.log("job_start", job=run.job, attempt=run.attempt, path=run.path)
        if reply.drain and not self.draining:
            self.draining = True
            self.log("draining", reason="controller")

    def power_off(self) -> None:
        """Out of contact too long, or refused: stop the backend and, on a VM, power the
        machine off (with no poweroff command, a local machine, the agent only exits)."""
        self.stop_backend()
        if not self.settings.poweroff:
            self.log("poweroff_skipped", reason="no poweroff command")
            return
        self.log("poweroff", command=" ".join(self.settings.poweroff))
        try:
            subprocess.run(list(self.settings.poweroff), check=False, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            self.log("poweroff_failed", reason=exc)

    def drop(self, run: JobRun, reason: str) -> None:
        """Stop a job: drop its request and, when it was the only job, restart the backend so
        the work really stops. A killed job is then reported cancelled; others are forgotten."""
        with self.lock:
            alone = len(self.running()) == 1 and not run.done.is_set()
        run.stop(reason)
        with self.lock:
            if reason == "cancelled":
                run.report = ResultRequest(status="cancelled")
            elif self.runs.get(run.job) is run:
                del self.runs[run.job]
        if alone and self.runtime is not None:
            self.recycle_due = True
        self.wake.set()

    def forget(self, run: JobRun) -> None:
        with self.lock:
            if self.runs.get(run.job) is run:
                del self.runs[run.job]

    def job_done(self, run: JobRun) -> None:
        """A job's thread ended: its result rides the loop's next poll, which this wakes. If a
        long-poll is out, the courier takes it unless that poll comes back within the grace."""
        with self.lock:
            if run.report is not None and run.report.status != "cancelled":
                if self.config.recycle == "job":
                    self.recycle_due = True
                if self.holding and not run.sending and self.runs.get(run.job) is run:
                    run.sending = True
                    self.courier_queue.append((run, self.polls))
                    self.courier_wake.set()
            self.lock.notify_all()
        self.wake.set()

    # --- the watchdog and the courier ------------------------------------------------------

    def watch(self) -> None:
        """Give jobs up on the agent's own clock, whatever the network calls are doing."""
        while not self.finished.is_set():
            with self.lock:
                now = time.monotonic()
                lease = self.config.lease
                due = [
                    run
                    for run in self.running()
                    if now >= abandon_at(run.renewed_at, lease, self.margin)
                ]
                for run in due:
                    del self.runs[run.job]
                stop_backend = bool(due) and not self.running()
                give_up = self.give_up_at()
            if not due:
                # Its own time wakes it (leases.watch_pause), or the end; never the lock's
                # notifications, several a job, none of which brings a give-up point closer.
                self.finished.wait(watch_pause(now, give_up, self.poll_sent, lease, self.margin))
                continue
            for run in due:
                self.log("abandon", job=run.job, attempt=run.attempt, reason="lease not renewed")
                run.stop("abandoned")
            if stop_backend:
                # the work must end now, not when a blocked poll returns: the loop starts the
                # backend again once it is idle
                self.log("backend_stop", reason="jobs abandoned")
                self.stop_backend()
            self.wake.set()

    def deliver(self) -> None:
        """The courier: posts the large results, and those that end while a long-poll is held
        that does not come back within COURIER_GRACE_SECONDS (the next poll carries those that
        it does)."""
        while not self.finished.is_set():
            self.courier_wake.wait(1.0)
            self.courier_wake.clear()
            while True:
                with self.lock:
                    if not self.courier_queue:
                        break
                    run, poll = self.courier_queue.pop(0)
                    if poll is not None and not self._held_past_grace(poll):
                        run.sending = False  # the held poll came back: the next one carries it
                        self.wake.set()
                        continue
                self.send_result(run)

    def _held_past_grace(self, poll: int) -> bool:
        """Wait (under lock) up to the grace for the held poll ``poll`` to come back; True if
        a poll is still out at the end (that one, or a later one that does not carry the
        result), when only the courier can deliver it soon."""
        ends = time.monotonic() + COURIER_GRACE_SECONDS
        while self.holding and self.polls == poll and not self.finished.is_set():
            left = ends - time.monotonic()
            if left <= 0:
                break
            self.lock.wait(left)
        return self.holding

    def send_result(self, run: JobRun) -> None:
        assert run.report is not None
        report = dataclasses.replace(run.report, posted=run.posted())
        try:
            answer = self.courier.result(run.job, run.attempt, report)
        except Gone as exc:
            self.gone = str(exc)
            self.wake.set()
            return
        except Refused as exc:
            self.log("result_refused", job=run.job, attempt=run.attempt, reason=exc)
            self.forget(run)
            return
        except ControllerError as exc:
            self.log("result_held", job=run.job, attempt=run.attempt, reason=exc)
            with self.lock:
                run.sending = False  # the loop's next poll carries it
            self.wake.set()
            return
        self.last_contact = time.monotonic()
        self.log("result", job=run.job, attempt=run.attempt, status=answer.job_status)
        self.forget(run)


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
