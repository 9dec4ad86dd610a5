"""The demo on a terminal: its live view's last frame, drawn once dev has stopped, says the
controller is stopping, not that it waits for a leadership it held all along."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tests.dev_process import example_project
from tests.helpers import ROOT, on_a_terminal

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
    env = {"SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0", "SPKY_TICK": "200ms",
           "SPKY_STORE": "", "TERM": "xterm"}  # fmt: skip
    code, seen = on_a_terminal(_demo_arguments(), tmp_path, env)
    text = ANSI.sub("", seen)
    assert code == 0, text
    frames = text.split("Ctrl-C stops everything")
    assert "leader · " in text, text  # the frames while it ran
    last = frames[-2].rsplit("\n", 1)[-1]  # the footer of the last frame drawn
    assert "waiting for leadership" not in last, text
    assert last.strip().endswith("stopping ·"), last
