"""Runtimes run the backend: ``process`` (its deploy.command as a child process). The
``docker`` runtime shares this interface.

A runtime starts, stops and restarts the backend and says whether it answers. Jobs are sent
to ``http://127.0.0.1:<port><path>`` by the agent, whatever the runtime.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import IO, Protocol

from agent.errors import RuntimeError_

STOP_GRACE_SECONDS = 5.0
# What a process needs to exist, and nothing else, passed on from the agent's own environment
# (machine-pools.txt, "Environment": the backend sees its own env, the image's ENV, SPKY_ENV,
# SPKY_DB_NS, SPKY_DB_NAME and PORT). PATH: a command such as ``python3 app.py`` is found,
# and the backend can start the tools it runs. HOME: libraries keep caches and settings under
# it, and some refuse to start without it. LANG, LC_ALL, LC_CTYPE: the text encoding of its
# files and output (Python sets LC_CTYPE itself under the C locale, PEP 538). TZ: its local
# time. None of these carries a secret.
PROCESS_BASICS = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ")


def backend_environment(
    own: Mapping[str, str],
    port: int,
    agent_env: Mapping[str, str],
    inherit: Sequence[str] = (),
) -> dict[str, str]:
    """The backend's whole environment, an allow-list: PROCESS_BASICS and the names in
    ``inherit`` (the image's ENV, on a machine that is a container) from the agent's own
    environment, then the backend's own env (with SPKY_ENV, SPKY_DB_NS, SPKY_DB_NAME as the
    controller sends them), then PORT. Nothing else of the agent's or controller's."""
    passed = {
        name: agent_env[name]
        for name in (*PROCESS_BASICS, *inherit)
        if name in agent_env and not name.startswith("SPKY_AGENT_")
    }
    return {**passed, **own, "PORT": str(port)}


class Runtime(Protocol):
    port: int

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def alive(self) -> bool: ...
    def describe(self) -> str: ...


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ProcessRuntime:
    """The backend's command as a child process in a process group of its own, told its port
    in PORT (several machines share one host, so each gets a free port)."""

    def __init__(
        self,
        command: Sequence[str],
        env: Mapping[str, str],
        workdir: str,
        output: IO[bytes] | None = None,
        inherit: Sequence[str] = (),
    ) -> None:
        if not command:
            raise RuntimeError_(
                "the backend has no deploy.command; a process machine needs one to run it"
            )
        self.command = list(command)
        self.env = dict(env)
        self.workdir = workdir
        self.output = output
        self.inherit = tuple(inherit)
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.port = free_port()
        env = backend_environment(self.env, self.port, os.environ, self.inherit)
        try:
            self.proc = subprocess.Popen(
                self.command,
                env=env,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=self.output,
                stderr=subprocess.STDOUT if self.output is not None else None,
                process_group=0,
            )
        except OSError as exc:
            raise RuntimeError_(f"cannot start {self.command[0]!r}: {exc.strerror}") from exc

    def stop(self) -> None:
        """SIGTERM to the backend's process group, SIGKILL after a grace period."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        for sig, grace in ((signal.SIGTERM, STOP_GRACE_SECONDS), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        with contextlib.suppress(ProcessLookupError):  # whatever the backend left in its group
            os.killpg(proc.pid, signal.SIGKILL)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def describe(self) -> str:
        pid = self.proc.pid if self.proc else None
        return f"process pid={pid} port={self.port}"


def answers(port: int, healthcheck: str | None, timeout: float = 1.0) -> bool:
    """Whether the backend is ready: its healthcheck answers 2xx, or without one, its port
    accepts connections."""
    if not healthcheck:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=timeout):
                return True
        except OSError:
            return False
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", healthcheck)
        status = conn.getresponse().status
        return 200 <= status < 300
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


def wait_ready(runtime: Runtime, healthcheck: str | None, deadline: float) -> str | None:
    """Block until the backend answers (None) or cannot (the reason)."""
    delay = 0.02
    while time.monotonic() < deadline:
        if not runtime.alive():
            return f"the backend exited before it was ready ({runtime.describe()})"
        if answers(runtime.port, healthcheck):
            return None
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    what = f"GET {healthcheck} answering 2xx" if healthcheck else "its port accepting connections"
    return f"the backend was not ready within the boot timeout (waited for {what})"
