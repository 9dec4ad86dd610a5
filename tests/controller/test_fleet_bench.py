"""bench/fleet.py at a tiny size: it runs end to end (a controller process, virtual agents
joining and polling over HTTP, jobs through the client, a restart) and prints its figures.
Timings are the bench's to report, not checked here."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.slow
def test_the_fleet_bench_prints_its_figures_at_a_tiny_size() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "fleet.py"), "--quick", "--sizes", "3"],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [each for each in done.stdout.splitlines() if "sqlite 3 machines:" in each]
    for figure in ("tick p50", "dispatch p50", "CPU ms a poll", "a job", "RSS", "storm"):
        assert figure in line, line
    assert "target sqlite 3: tick p50 < 5 ms" in done.stdout
    assert "PostgreSQL: skipped" in done.stdout
