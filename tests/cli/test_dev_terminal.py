"""`dev` on a terminal of 80 columns, local machines and SQLite, as a new user runs it: its
lines tell every event (several of one instant too) and the jobs' outcomes; a breaker opened
by failed boots is said at start, `pools resume` says that it, not a pause, holds the pool,
and `pools reset` closes it; the live view and its summary stay readable."""

from __future__ import annotations

import re
import signal
from pathlib import Path

from sp00ky_infra.store import open_store
from tests.cli.terminal import Terminal, run
from tests.controllers import wait_for
from tests.dev_process import example_project, kill_all_in

DEV = ("dev", "sp00ky.yml", "--machines", "local")
FAST = {"SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0", "SPKY_TICK": "200ms"}
REFUSED = {**FAST, "SPKY_POOL_MAX_MACHINES": "0", "SPKY_BREAKER_PAUSE": "10m"}


def test_dev_tells_events_of_one_instant_and_a_killed_job_and_this_run_apart(
    tmp_path: Path,
) -> None:
    folder = example_project(tmp_path / "project")
    dev = Terminal(
        folder, *DEV, "--plain", "--burst", "2", "--path", "/render",
        "--payload", '{"gameId": "a", "seconds": 4}', env=FAST,
    )  # fmt: skip
    store = open_store(f"sqlite:///{folder}/.sp00ky/state.db")
    try:
        # one tick asks for both machines: two events of one instant, both told
        dev.wait_for(r"(?s)scale_up: render-\w+ requested.*scale_up: render-\w+ requested")
        running = wait_for(
            lambda: [j for j in store.list_jobs(limit=10) if j.status == "processing"],
            timeout=60,
            what="a job running",
        )[0]
        assert run(folder, "jobs", "kill", running.id).count(running.id) >= 1
        dev.wait_for(re.escape(f"job_killed: {running.id} killed (killed while it ran)"))
        dev.proc.send_signal(signal.SIGINT)  # the other job finishes, then the summary
        assert dev.wait(timeout=60) == 0, dev.output
    finally:
        dev.stop()
        store.close()
        kill_all_in(folder)
    summary = dev.wait_for(r"dev: stopped; .*")
    assert "1 of 2 job(s) succeeded, 1 failed" in summary.group(0), dev.output
    assert re.search(r"This run: 2 machine\(s\) destroyed, .* of 2 machine\(s\)", dev.output)
    assert re.search(r"pool render: \d+\.\d{4} EUR as cx33", dev.output)
    assert "The store in all (every run on it): pool render: 2 machine(s)" in dev.output


def test_a_breaker_is_said_at_start_resume_names_it_and_reset_closes_it(tmp_path: Path) -> None:
    folder = example_project(tmp_path / "project")
    burst = ("--burst", "1", "--path", "/render", "--payload", '{"gameId": "a"}')
    dev = Terminal(folder, *DEV, "--plain", *burst, env=REFUSED)
    again: Terminal | None = None
    try:
        dev.wait_for(r"render breaker_open: 3 failed boots in a row \(last: refused")
        resumed = run(folder, "pools", "resume", "render")
        assert re.search(
            r"render: resumed, but its breaker holds it, not a pause: 3 failed boot\(s\) in a "
            r"row, no new machine until [\d: -]+ UTC; once the backend is fixed, run\s+"
            r"`sp00ky-infra pools reset render`",
            resumed,
        ), resumed
        reset = run(folder, "pools", "reset", "render")
        assert re.search(r"render: breaker closed \(it was open: 3 failed boot\(s\)", reset), reset
        dev.wait_for(r"render breaker_closed: reset by the admin API; the breaker is closed")
        # the cap still refuses every machine: the breaker opens again, and is kept
        dev.wait_for(r"(?s)breaker_closed: reset by.*breaker_open: 3 failed boots")
        dev.proc.send_signal(signal.SIGINT)
        assert dev.wait(timeout=60) == 0, dev.output

        again = Terminal(folder, *DEV, "--plain", env=REFUSED)
        said = again.wait_for(r"dev: pool render: its breaker is OPEN since .*")
        assert re.search(
            r"since \d\d:\d\d:\d\d \(3 failed boots in a row \(last: refused: .*machine cap is 0"
            r".*\): no new machine until \d\d:\d\d:\d\d; once the backend is fixed,\s+"
            r"`sp00ky-infra pools reset render` closes it",
            said.group(0),
        ), again.output
    finally:
        dev.stop()
        if again is not None:
            again.stop()
        kill_all_in(folder)


def test_the_live_view_keeps_to_80_columns_and_cuts_nothing(tmp_path: Path) -> None:
    folder = example_project(tmp_path / "project")
    dev = Terminal(
        folder, *DEV, "--burst", "2", "--path", "/render",
        "--payload", '{"gameId": "a", "seconds": 1}', "--timings", "idleTimeout=1s",
        "--exit-when-idle", env=FAST,
    )  # fmt: skip
    try:
        assert dev.wait(timeout=120) == 0, dev.output
    finally:
        dev.stop()
        kill_all_in(folder)
    frames = dev.output
    assert re.search(r"pool\s+┃\s+want\s+┃\s+boot\s+┃\s+ready\s+┃\s+busy\s+┃\s+drain", frames)
    assert re.search(r"render\s+│.*│\s+closed", frames), frames
    store = open_store(f"sqlite:///{folder}/.sp00ky/state.db")
    try:
        names = [m.name for m in store.machines.recent("render")]
    finally:
        store.close()
    assert names and all(name in frames for name in names)  # in the events, whole
    table_lines = [line for line in frames.splitlines() if "│" in line or "┃" in line]
    assert table_lines and max(len(line.rstrip()) for line in table_lines) <= 80
    assert "…" not in frames
