"""The demo on a terminal: its live view's last frame, drawn once dev has stopped, says the
controller stopped, not that it waits for a leadership it held all along."""

from __future__ import annotations

import os
import pty
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

from tests.dev_process import example_project
from tests.helpers import ROOT, drain_pty

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def _demo_arguments() -> list[str]:
    """The arguments scripts/demo gives `sp00ky-infra` (its own extra ones left out)."""
    text = (ROOT / "scripts" / "demo").read_text()
    command = text.split("\nexec ", 1)[1].replace("\\\n", " ").replace('"$@"', "")
    program, *arguments = shlex.split(command)
    assert program == ".venv/bin/sp00ky-infra"
    return arguments


def test_the_demo_s_last_frame_does_not_wait_for_leadership(tmp_path: Path) -> None:
    example_project(tmp_path / "examples")
    env = {
        **os.environ, "SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0", "SPKY_TICK": "200ms",
        "COLUMNS": "160", "LINES": "60", "TERM": "xterm",
    }  # fmt: skip
    env.pop("SPKY_STORE", None)
    leader, follower = pty.openpty()
    dev = subprocess.Popen(
        [sys.executable, "-m", "sp00ky_infra", *_demo_arguments()], cwd=tmp_path, env=env,
        stdin=follower, stdout=follower, stderr=follower, start_new_session=True,
    )  # fmt: skip
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 120
        while dev.poll() is None and time.monotonic() < deadline:
            seen += drain_pty(leader, 0.2)
        seen += drain_pty(leader, 0.2)
    finally:
        if dev.poll() is None:
            dev.kill()
        dev.wait()
        os.close(leader)
    text = ANSI.sub("", seen.decode(errors="replace"))
    assert dev.returncode == 0, text
    frames = text.split("Ctrl-C stops everything")
    assert "leader · " in text, text  # the frames while it ran
    last = frames[-2].rsplit("\n", 1)[-1]  # the footer of the last frame drawn
    assert "waiting for leadership" not in last, text
    assert last.strip().endswith("stopping ·"), last
