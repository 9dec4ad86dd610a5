"""The agent's log lines as its machine log gets them: whole, whatever thread wrote them."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.helpers import ROOT

THREADS, LINES = 4, 2000
# Four threads logging at once, the way the poll loop, the courier and the watchdog can; the
# agent runs unbuffered (PYTHONUNBUFFERED=1 in its unit, its image and on local machines).
WRITERS = f"""
import threading
from agent.main import log

def write(n):
    for i in range({LINES}):
        log("m1", "job_start", job=f"j{{n}}-{{i}}", attempt="0123456789abcdef")

threads = [threading.Thread(target=write, args=(n,)) for n in range({THREADS})]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
"""
LINE = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d agent machine=m1 event=job_start "
    r"job=j(\d)-(\d+) attempt=0123456789abcdef"
)


def test_lines_written_by_several_threads_never_run_together() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WRITERS],
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = done.stdout.split("\n")
    assert lines.pop() == ""  # the output ends with a newline
    broken = [line for line in lines if not LINE.fullmatch(line)]
    assert not broken, f"{len(broken)} of {len(lines)} lines ran together: {broken[:3]}"
    seen = sorted((int(m[1]), int(m[2])) for m in map(LINE.fullmatch, lines) if m)
    assert seen == [(n, i) for n in range(THREADS) for i in range(LINES)]
