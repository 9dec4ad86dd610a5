"""The real CLI under a pseudo-terminal of a given size, as a user's terminal runs it: what it
prints (escape sequences removed, for the tests' reading), signals as a terminal sends them,
and the process stopped at the end."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from contextlib import suppress
from pathlib import Path

from tests.dev_process import Watched, _default_signals

STYLES = re.compile(r"\x1b\[[0-9;?]*[mhl]|\x1b[()][0-9A-Za-z]|\x1b[=>]|\r")
MOVES = re.compile(r"(\x1b\[[0-9;?]*[A-Za-z])+")  # a cursor's moves and erasures


def plain(text: str) -> str:
    """``text`` without a terminal's styles and carriage returns, a cursor's moves (a live
    view redrawn) as line breaks."""
    return MOVES.sub("\n", STYLES.sub("", text))


def _sized(fd: int, columns: int, rows: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))


class Terminal(Watched):
    """``sp00ky-infra ARGS`` in ``folder`` on a terminal ``columns`` wide."""

    def __init__(
        self,
        folder: Path,
        *args: str,
        env: dict[str, str] | None = None,
        columns: int = 80,
        rows: int = 40,
    ) -> None:
        primary, secondary = pty.openpty()
        _sized(secondary, columns, rows)
        inherited = {k: v for k, v in os.environ.items() if k != "SPKY_STORE"}
        full_env = {**inherited, "TERM": "xterm", "COLUMNS": str(columns), **(env or {})}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sp00ky_infra", *args],
            cwd=folder,
            env=full_env,
            stdin=secondary,
            stdout=secondary,
            stderr=secondary,
            preexec_fn=_default_signals,
        )
        os.close(secondary)
        self._primary = primary
        self._chunks: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._primary, 65536)
            except OSError:  # the terminal's other end closed: the process ended
                return
            if not chunk:
                return
            self._chunks.append(chunk)

    @property
    def raw(self) -> str:
        return b"".join(self._chunks).decode(errors="replace")

    @property
    def output(self) -> str:
        return plain(self.raw)

    def wait_for(self, pattern: str, timeout: float = 60) -> re.Match[str]:
        """The first match of ``pattern`` (a regex) in what it printed, waiting for it."""
        wanted = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while True:
            found = wanted.search(self.output)
            if found:
                return found
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self._reader.join(timeout=1)
                found = wanted.search(self.output)
                if found:
                    return found
                raise AssertionError(f"no {pattern!r} in:\n{self.output}")
            time.sleep(0.05)

    def stop(self) -> None:
        """At teardown: two Ctrl-C (a drain, then an abort), else a kill; the terminal closed."""
        super().stop()
        with suppress(OSError):  # closed already: stopped twice
            os.close(self._primary)


def run(folder: Path, *args: str, env: dict[str, str] | None = None, columns: int = 80) -> str:
    """A command run to its end on a terminal ``columns`` wide: what it printed."""
    terminal = Terminal(folder, *args, env=env, columns=columns)
    try:
        terminal.wait(timeout=60)
    finally:
        terminal.stop()
    return terminal.output
