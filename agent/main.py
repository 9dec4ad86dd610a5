"""The agent's loop: join, start the backend, report ready, then poll for work, run jobs,
renew their leases with every poll, and deliver results until the controller has them.

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
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from agent import controller as remote
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
from agent.jobs import JobRun
from agent.leases import abandon_at, safety_margin
from agent.protocol import (
    AgentSettings,
    BackendInfo,
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


def log(machine: str, event: str, **fields: Any) -> None:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime())
    extra = " ".join(f"{key}={value}" for key, value in fields.items() if value is not None)
    print(f"{stamp} agent machine={machine} event={event} {extra}".rstrip(), flush=True)


class Agent:
    def __init__(self, settings: Settings, runtime_factory: Any = None) -> None:
        self.settings = settings
        self.machine = settings.machine
        self.remote = remote.Controller(settings.controller_url, settings.machine)
        self.runs: dict[str, JobRun] = {}  # by job id: running, or finished and unreported
        self.wake = threading.Event()
        self.stopping = 0  # signals received: 1 drains, 2 stops at once
        self.draining = False
        self.recycle_due = False
        self.last_contact = time.monotonic()
        self.runtime: Runtime | None = None
        self.runtime_factory = runtime_factory or self._process_runtime

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
        try:
            return self.loop()
        finally:
            for run in self.runs.values():
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
        if self.runtime is None:
            self.runtime = self.runtime_factory(self.backend)
        assert self.runtime is not None
        self.runtime.start()
        deadline = time.monotonic() + self.config.boot_timeout
        return wait_ready(self.runtime, self.backend.healthcheck, deadline)

    def stop_backend(self) -> None:
        if self.runtime is not None:
            self.runtime.stop()

    def runtime_alive(self) -> bool:
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

    def running(self) -> list[JobRun]:
        return [run for run in self.runs.values() if not run.done.is_set()]

    def loop(self) -> int:
        failures = 0
        while True:
            if self.stopping >= 2:
                self.log("stopped", reason="second signal")
                return 1
            if self.stopping == 1 and not self.draining:
                self.draining = True
                self.log("draining", reason="signal")
            self.deliver_results()
            self.enforce_leases()
            if self.draining and not self.runs:
                self.call(self.remote.drained)
                self.log("drained")
                return 0
            idle = not self.running() and self.runtime is not None
            if idle and (self.recycle_due or not self.runtime_alive()):
                why = "recycle" if self.recycle_due else "the backend exited"
                self.recycle_due = False
                if not self.restart_backend(why):
                    return 5
            free = 0
            if not self.draining and self.runtime is not None and self.runtime.alive():
                free = max(0, self.config.slots - len(self.runs))
            wait = self.config.poll_wait if free > 0 else 0.0
            reported = tuple(
                RunningAttempt(job=run.job, attempt=run.attempt, posted=run.posted())
                for run in self.runs.values()
            )
            sent = time.monotonic()
            try:
                reply = self.remote.poll(PollRequest(running=reported, free_slots=free, wait=wait))
            except Gone as exc:
                self.log("gone", reason=exc)
                return 0
            except ControllerError as exc:
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
            self.handle(reply, sent)
            if free == 0 and not reply.assignments:
                # busy: poll again soon for kills and renewals, or at once when a job ends
                self.wake.wait(min(1.0, self.config.lease / 6))
                self.wake.clear()

    def handle(self, reply: PollReply, sent: float) -> None:
        stopped = {stop.job for stop in reply.stop}
        for run in self.runs.values():
            if run.job not in stopped:
                run.renewed_at = sent  # this poll's send time renewed its lease
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
            self.runs[run.job] = run
            self.log("job_start", job=run.job, attempt=run.attempt, path=run.path)
            assert self.runtime is not None
            run.start(self.runtime.port, on_done=self.wake.set)
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
        alone = len(self.running()) == 1 and not run.done.is_set()
        run.stop(reason)
        if reason == "cancelled":
            run.report = ResultRequest(status="cancelled")
        else:
            self.runs.pop(run.job, None)
        if alone and self.runtime is not None:
            self.recycle_due = True

    def enforce_leases(self) -> None:
        """Give a job up before the controller can count its lease as expired."""
        now = time.monotonic()
        lease = self.config.lease
        for run in list(self.runs.values()):
            if not run.done.is_set() and now >= abandon_at(run.renewed_at, lease, self.margin):
                self.log("abandon", job=run.job, attempt=run.attempt, reason="lease not renewed")
                self.drop(run, "abandoned")

    def deliver_results(self) -> None:
        for run in list(self.runs.values()):
            if not run.done.is_set() or run.report is None:
                continue
            if run.report.status != "cancelled" and self.config.recycle == "job":
                self.recycle_due = True
            try:
                report = dataclasses.replace(run.report, posted=run.posted())
                answer = self.remote.result(run.job, run.attempt, report)
                self.last_contact = time.monotonic()
                self.log("result", job=run.job, attempt=run.attempt, status=answer.job_status)
                self.runs.pop(run.job, None)
            except Refused as exc:
                self.log("result_refused", job=run.job, attempt=run.attempt, reason=exc)
                self.runs.pop(run.job, None)
            except ControllerError as exc:
                self.log("result_held", job=run.job, attempt=run.attempt, reason=exc)
                return  # kept until the controller has it; tried again next turn


def main() -> int:
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
