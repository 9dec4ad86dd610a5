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
import sys
import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Protocol

from agent.clock import Clock, Monotonic, looks
from agent.errors import RuntimeError_
from agent.tail import TAIL_LINE_CHARS, TAIL_LINES, output_summary

STOP_GRACE_SECONDS = 5.0
# What a process needs to exist, and nothing else, passed on from the agent's own environment
# (the backend sees its own env, the image's ENV, SPKY_ENV, SPKY_DB_NS, SPKY_DB_NAME and
# PORT). PATH: a command such as ``python3 app.py`` is found,
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
    env: dict[str, str]  # the backend's own env: its values never leave the machine

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def alive(self) -> bool: ...
    def describe(self) -> str: ...
    def last_output(self) -> list[str]:
        """The last lines the backend wrote (stdout and stderr), oldest first, unredacted."""
        ...


class OutputTail:
    """Copies a backend's output on to the agent's own (the machine log: a file under dev,
    the journal on a VM, the container's log under Docker) and keeps its last lines."""

    def __init__(self, stream: IO[bytes], sink: IO[bytes] | None, lines: int = TAIL_LINES) -> None:
        self._lines: deque[str] = deque(maxlen=lines)
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._copy, args=(stream, sink), name="backend-output", daemon=True
        )
        self._thread.start()

    def _copy(self, stream: IO[bytes], sink: IO[bytes] | None) -> None:
        with contextlib.suppress(OSError, ValueError):
            for raw in iter(stream.readline, b""):
                if sink is not None:
                    with contextlib.suppress(OSError, ValueError):
                        sink.write(raw)
                        sink.flush()
                with self._lock:
                    self._lines.append(raw.decode(errors="replace")[: TAIL_LINE_CHARS * 4])
        with contextlib.suppress(OSError):
            stream.close()

    def lines(self, settle: float = 0.2) -> list[str]:
        """The last lines; waits up to ``settle`` seconds for what an exited backend wrote
        last to be read."""
        self._thread.join(timeout=settle)
        with self._lock:
            return list(self._lines)


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
        self.tail: OutputTail | None = None

    def start(self) -> None:
        self.port = free_port()
        env = backend_environment(self.env, self.port, os.environ, self.inherit)
        try:
            self.proc = subprocess.Popen(
                self.command,
                env=env,
                cwd=self.workdir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                process_group=0,
            )
        except OSError as exc:
            raise RuntimeError_(f"cannot start {self.command[0]!r}: {exc.strerror}") from exc
        assert self.proc.stdout is not None
        sink = self.output if self.output is not None else _stdout()
        self.tail = OutputTail(self.proc.stdout, sink)

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
        code = self.proc.poll() if self.proc else None
        exited = f" exit code {code}" if code is not None else ""
        return f"process pid={pid} port={self.port}{exited}"

    def last_output(self) -> list[str]:
        return self.tail.lines() if self.tail is not None else []


def _stdout() -> IO[bytes] | None:
    """The agent's own standard output, where the backend's output goes on to."""
    return getattr(sys.stdout, "buffer", None)


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


def wait_ready(
    runtime: Runtime,
    healthcheck: str | None,
    deadline: float,
    clock: Clock | None = None,
    probe: Callable[[int, str | None], bool] = answers,
) -> str | None:
    """Block until the backend answers (None) or cannot (the reason, with the backend's last
    lines of output, bounded and redacted). It looks at once, then after 50 ms, then every
    100 ms (``clock.looks``): a backend up in a moment is seen in a
    moment."""
    clock = clock or Monotonic()
    never = threading.Event()  # nothing cuts the wait short but the deadline
    for pause in looks():
        if not runtime.alive():
            why = f"the backend exited before it was ready ({runtime.describe()})"
            return f"{why}; {_output_of(runtime)}"
        if probe(runtime.port, healthcheck):
            return None
        left = deadline - clock.now()
        if left <= 0:
            break
        clock.wait(never, min(pause, left))
    what = f"GET {healthcheck} answering 2xx" if healthcheck else "its port accepting connections"
    why = f"the backend was not ready within the boot timeout (waited for {what})"
    return f"{why}; {_output_of(runtime)}"


def _output_of(runtime: Runtime) -> str:
    try:
        lines = runtime.last_output()
    except Exception as exc:  # the output is a help, never a reason to fail otherwise
        return f"its output could not be read ({type(exc).__name__})"
    return output_summary(lines, runtime.env.values())
