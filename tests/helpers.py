"""Helpers shared by tests that run real processes."""

from __future__ import annotations

import os
import select
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cli(
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
