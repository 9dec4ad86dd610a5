"""Local-process machines: each machine is an agent subprocess that runs the backend's
``deploy.command`` as its child. The embedded default, and the workhorse of the tests.

Agents run in sessions of their own, so that a restarted controller finds them still
working (they reconnect), and so that destroying a machine ends everything it ran: every
process of the agent's session, whether the agent is alive or not (a kill -9 of the agent
leaves its backend running in that session). The agent's start time is kept beside its pid,
so a recycled pid is never mistaken for it. A process that leaves the session (setsid)
escapes; a cgroup per machine would hold it, but needs a delegated cgroup tree, which an
unprivileged controller does not have.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from sp00ky_infra.controller.provisioners.base import (
    MachineSpec,
    Provisioned,
    ProvisionerError,
    Refused,
)
from sp00ky_infra.controller.provisioners.output import tail_of_file

STOP_GRACE_SECONDS = 3.0  # a destroyed machine was drained (or failed): no long goodbye
# What a local machine's agent inherits of the controller's environment: what a process needs
# to exist (agent/runtime.py, PROCESS_BASICS, says why each), where Python finds the agent
# (PYTHONPATH, a checkout run without installing), and the agent's own settings (SPKY_AGENT_*,
# e.g. SPKY_AGENT_POWEROFF). Nothing else: the controller's environment holds its secrets
# (HCLOUD_TOKEN, the store's URL, the pool secret) and its own settings.
AGENT_BASICS = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "PYTHONPATH")
AGENT_SETTINGS_PREFIX = "SPKY_AGENT_"


def agent_environment(controller_env: Mapping[str, str]) -> dict[str, str]:
    """The part of the controller's environment a local agent starts with: an allow-list."""
    return {
        name: value
        for name, value in controller_env.items()
        if name in AGENT_BASICS or name.startswith(AGENT_SETTINGS_PREFIX)
    }


def session_members(session: int) -> list[int]:
    """Processes in session ``session``: the agent, its backend and whatever that started."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session:  # after ")": state, ppid, pgrp, session
            members.append(int(entry.name))
    return members


def running(pid: int) -> bool:
    """Whether ``pid`` is a process that still runs (a zombie has ended its work)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def machine_processes(session: int, agent_started: str | None) -> list[int]:
    """The processes of the machine whose agent led session ``session`` and started at
    ``agent_started``: its session's members, whether the agent is alive or not (its
    backend outlives a kill -9 of the agent, in the same session).

    A session id outlives its leader; should the pid be reused by a process that leads a
    session of its own, only the members started before that process are the machine's.
    """
    members = session_members(session)
    holder = process_start_time(session)
    if holder is None or not agent_started or holder == agent_started:
        return members
    if session not in members:
        return members  # the pid is another process's, outside that process session
    newer = int(holder)
    return [
        pid for pid in members if pid != session and int(process_start_time(pid) or newer) < newer
    ]


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _wait_gone(pids: list[int], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


class LocalProvisioner:
    name = "local"
    delivers_join_token = True  # in the agent's environment

    def __init__(self, log_dir: str | Path, agent_env: dict[str, str] | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.agent_env = agent_env or {}
        self._children: dict[str, subprocess.Popen[bytes]] = {}

    def create(self, spec: MachineSpec) -> Provisioned:
        if spec.join_token is None:
            raise Refused(f"machine {spec.name} has no join token to start its agent with")
        self._reap()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **agent_environment(os.environ),
            **self.agent_env,
            "SPKY_AGENT_CONTROLLER_URL": spec.controller_url,
            "SPKY_AGENT_MACHINE": spec.name,
            "SPKY_AGENT_JOIN_TOKEN": spec.join_token,
            "SPKY_AGENT_RUNTIME": "process",
            "SPKY_AGENT_WORKDIR": str(Path(spec.workdir).resolve()),
            # the machine credential of its first join (0600): an agent started again with
            # this environment rejoins with it
            "SPKY_AGENT_CREDENTIAL_FILE": str(self._credential_file(spec.name).resolve()),
            # where it unpacks the agent a restarted controller serves, and runs it from
            "SPKY_AGENT_HOME": str(self._agent_home(spec.name).resolve()),
            "PYTHONUNBUFFERED": "1",
        }
        log = open(self.log_dir / f"{spec.name}.log", "ab")  # noqa: SIM115 (the child keeps it)
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "agent"],
                env=env,
                cwd=spec.workdir,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            raise Refused(f"cannot start the agent process: {exc}") from exc
        finally:
            log.close()
        self._children[spec.name] = proc
        return Provisioned(str(proc.pid), process_start_time(proc.pid) or "")

    def last_output(self, name: str, provider_id: str | None) -> list[str]:
        """The end of the machine's log file (its agent's lines and its backend's)."""
        return tail_of_file(str(self.log_dir / f"{name}.log"))

    def _credential_file(self, name: str) -> Path:
        return self.log_dir / f"{name}.credential"

    def _agent_home(self, name: str) -> Path:
        return self.log_dir / f"{name}.agent"

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        """End everything the machine ran, whether or not its agent is alive: every process of
        the agent's session (the agent, its backend, whatever that started). A live agent
        gets SIGTERM and STOP_GRACE_SECONDS to stop its backend itself, as before; what is
        left then (everything, when the agent is dead) gets SIGTERM (the example backend logs
        what it had in flight), then SIGKILL. Returns once none is left; ProvisionerError when
        some survive, so the machine is not counted as destroyed and its jobs are not run
        again elsewhere meanwhile."""
        self._credential_file(name).unlink(missing_ok=True)
        if not provider_id:
            return
        session = int(provider_id)
        child = self._children.pop(name, None)
        agent_alive = running(session) and (
            not provider_state or process_start_time(session) == provider_state
        )
        if agent_alive:
            _signal([session], signal.SIGTERM)
            _wait_gone([session], STOP_GRACE_SECONDS)
        members = [pid for pid in machine_processes(session, provider_state) if running(pid)]
        _signal(members, signal.SIGTERM)
        _wait_gone(members, STOP_GRACE_SECONDS if not agent_alive else 0.5)
        for _ in range(3):  # whatever is left, and what it forked meanwhile
            members = [pid for pid in machine_processes(session, provider_state) if running(pid)]
            if not members:
                break
            _signal(members, signal.SIGKILL)
            time.sleep(0.05)
        if child is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        left = [pid for pid in machine_processes(session, provider_state) if running(pid)]
        if left:
            raise ProvisionerError(f"machine {name}: processes {left} survived SIGKILL")
        shutil.rmtree(self._agent_home(name), ignore_errors=True)

    def close(self) -> None:
        self._reap()

    def _reap(self) -> None:
        for name, child in list(self._children.items()):
            if child.poll() is not None:
                del self._children[name]
