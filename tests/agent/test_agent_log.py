"""The agent's log lines as its machine log gets them: whole, whatever thread wrote them."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.helpers import ROOT

THREADS, LINES = 4, 2000
# Four threads logging at once, the way the poll loop, the courier and the watchdog can; the
# agent runs unbuffered (PYTHONUNBUFFERED=1 in its unit, its image and on local machines).
WRITERS = f"""
import threading
from agent.logs import log

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


# The agent's signal handler logs (Agent.on_signal), in the main thread, which may be inside
# log() right then: blocked writing to a full pipe (journald or Docker slow to read), where
# the handler runs.
SIGNALLED = """
import signal
from agent.logs import log

stop = []

def on_signal(signum, _):
    stop.append(signum)
    log("m1", "signal", signal=signal.Signals(signum).name)

signal.signal(signal.SIGTERM, on_signal)
n = 0
while not stop:
    log("m1", "job_start", job=f"j{n}", attempt="0123456789abcdef")
    n += 1
log("m1", "stopped")
"""


def test_a_signal_that_arrives_while_a_line_waits_on_a_full_pipe_still_logs_and_ends() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", SIGNALLED],
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        wchan = Path(f"/proc/{child.pid}/wchan")
        deadline = time.monotonic() + 10
        while not wchan.read_text().endswith("pipe_write"):  # unread, the pipe fills: log() waits
            assert time.monotonic() < deadline, "the child never blocked writing its log"
            time.sleep(0.01)
        child.send_signal(signal.SIGTERM)
        out, _ = child.communicate(timeout=20)  # a deadlocked child times out here
    finally:
        child.kill()
        child.wait()
    lines = out.split("\n")
    assert lines.pop() == ""
    assert all(re.fullmatch(r"\S+ agent machine=m1 event=\S+( .*)?", line) for line in lines)
    # the handler's line goes out first when it ran inside the waiting write, then that one
    events = [line.split(" event=", 1)[1] for line in lines]
    assert events.count("signal signal=SIGTERM") == 1
    assert events[-1] == "stopped"
    assert all(e.startswith("job_start ") for e in events[:-1] if e != "signal signal=SIGTERM")
