"""Helpers shared by tests that run real processes."""

from __future__ import annotations

import contextlib
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent
CI = bool(os.environ.get("CI"))  # CI draws every Hypothesis example (tests/conftest.py)


def cli(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``sp00ky-infra ARGS`` in this process (click's runner), and capture what it prints.

    The same command line, exit code, stdout and stderr as a user's process, without a new
    interpreter's start-up for each call; ``cli_process`` runs the real process where the test
    is about the process itself (signals, a terminal, what one import costs)."""
    from click.testing import CliRunner

    from sp00ky_infra.cli import cli as command

    runner = CliRunner()
    with contextlib.chdir(cwd or ROOT):
        result = runner.invoke(command, list(args), env=env, prog_name="sp00ky-infra")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        ["sp00ky-infra", *args], result.exit_code, result.stdout, result.stderr
    )


def cli_process(
    *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m sp00ky_infra ARGS`` as a user would, and capture what it prints."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "sp00ky_infra", *args],
        cwd=cwd or ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def examples(wanted: int) -> int:
    """How many examples a Hypothesis test with ``wanted`` in CI draws here: all of them in CI
    (the ``ci`` profile, tests/conftest.py), a fifth on a developer's machine."""
    return wanted if CI else max(10, wanted // 5)


def drain_pty(fd: int, wait: float = 0.1) -> bytes:
    """What a pty's leader side holds now: read until nothing more comes within ``wait``
    seconds, or the other side is gone (EOF; an OSError once the process has exited)."""
    got = b""
    while select.select([fd], [], [], wait)[0]:
        try:
            chunk = os.read(fd, 65536)
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    return got


def across_a_restart(store_url: str, write: Callable[[Any], object], read: Callable[[Any], T]) -> T:
    """``write`` into the store at ``store_url``, closed, then what ``read`` reads from it
    opened again (what a restarted controller finds)."""
    from sp00ky_infra.store import open_store

    first = open_store(store_url)
    try:
        write(first)
    finally:
        first.close()
    again = open_store(store_url)
    try:
        return read(again)
    finally:
        again.close()


def render_job(**fields: Any) -> Any:
    """A NewJob of the example's renderer on pool render, ``fields`` changed."""
    from sp00ky_infra.store import NewJob

    base: dict[str, Any] = {
        "backend": "renderer", "table": "render_job", "path": "/render", "pool": "render",
    }  # fmt: skip
    return NewJob(**{**base, **fields})


def on_a_terminal(
    args: list[str], cwd: Path, env: dict[str, str], timeout: float = 120
) -> tuple[int, str]:
    """Run ``python -m sp00ky_infra ARGS`` with a pty as its terminal (120 columns) until it
    exits or ``timeout`` passes; its exit code and all it wrote there."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sp00ky_infra", *args],
        cwd=cwd, env={**os.environ, **env, "COLUMNS": "120"},
        stdin=follower, stdout=follower, stderr=follower, close_fds=True,
    )  # fmt: skip
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if select.select([leader], [], [], 0.2)[0]:
                try:
                    chunk = os.read(leader, 65536)
                except OSError:
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        code = proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
    return code, seen.decode(errors="replace")
