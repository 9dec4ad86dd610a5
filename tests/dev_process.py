"""`sp00ky-infra dev` as a real process for tests: its lines as it prints them, signals as a
terminal sends them, and every process it started stopped at the end."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import suppress
from pathlib import Path
from typing import Any

from tests.helpers import ROOT

ADMIN_URL = re.compile(r"admin API (http://[0-9.]+:\d+)")


def example_project(folder: Path) -> Path:
    """A copy of examples/ (the render pool, min 0, max 2) with no state of its own."""
    shutil.copytree(ROOT / "examples", folder, ignore=shutil.ignore_patterns(".sp00ky"))
    return folder


def _default_signals() -> None:
    """A test runner started in the background ignores SIGINT, and its children inherit
    that: give the process the default handlers a terminal's would have."""
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


class Watched:
    """A process under test, read by a thread of its own."""

    proc: subprocess.Popen[Any]
    _reader: threading.Thread

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return code

    def stop(self) -> None:
        """At teardown: a stop that still works (two Ctrl-C), else a kill."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            time.sleep(0.3)
            if self.proc.poll() is None:
                self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(timeout=5)


class Dev(Watched):
    """One ``dev`` process in ``folder`` (``--plain``: events as lines)."""

    def __init__(
        self, folder: Path, *args: str, env: dict[str, str] | None = None, local: bool = True
    ) -> None:
        """``local``: ``--machines local`` (else dev chooses, docker when an engine answers)."""
        machines = ["--machines", "local"] if local else []
        full_env = {
            **os.environ,
            "SPKY_POOL_PORT": "0",
            "SPKY_ADMIN_PORT": "0",
            "SPKY_TICK": "200ms",
            "PYTHONUNBUFFERED": "1",
            **(env or {}),
        }
        full_env.pop("SPKY_STORE", None)
        self.folder = folder
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sp00ky_infra",
                "dev",
                "sp00ky.yml",
                "--plain",
                *machines,
                *args,
            ],
            cwd=folder,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_default_signals,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_line(self, pattern: str, timeout: float = 30) -> re.Match[str]:
        """The first line matching ``pattern`` (a regex), waiting for it."""
        wanted = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            for line in list(self.lines):
                found = wanted.search(line)
                if found:
                    return found
            if time.monotonic() > deadline or (self.proc.poll() is not None and not self._more()):
                raise AssertionError(f"no line matching {pattern!r} in:\n{self.output}")
            time.sleep(0.05)

    def _more(self) -> bool:
        self._reader.join(timeout=0.5)
        return self._reader.is_alive()

    @property
    def admin_url(self) -> str:
        return self.wait_line(ADMIN_URL.pattern).group(1)

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)


def processes_in(folder: Path) -> list[int]:
    """Processes (agents, backends) whose working directory is ``folder`` or below it."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        if cwd == folder or folder in cwd.parents:
            found.append(int(entry.name))
    return found


def kill_all_in(folder: Path) -> None:
    for pid in processes_in(folder):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
