"""Listings on a terminal of 80 columns and through a pipe: what a user copies (job ids,
schedule and machine names) is never cut, and the `jobs` dashboard keeps its status readable."""

from __future__ import annotations

import json
import re
import signal
import time
from pathlib import Path

from sp00ky_infra.store import NewJob, open_store
from sp00ky_infra.store.schedules import ScheduleTable
from tests.cli.terminal import Terminal, run
from tests.controller.test_schedules_controller import RENDER, write_project
from tests.dev_process import example_project
from tests.helpers import cli_process, render_job

LONG = "nightly-render-of-every-game-in-catalog"  # names are at most 40 characters
NEW = NewJob(backend="renderer", table="render_job", path="/render", payload={"gameId": "g"})


def _whole(output: str, *values: str) -> None:
    """Each value on one line of ``output``, and nothing shortened with an ellipsis."""
    for value in values:
        assert value in output, f"{value!r} not whole in:\n{output}"
    assert "…" not in output, output


def _within(output: str, columns: int) -> None:
    """Every line of a table in ``output`` at most ``columns`` wide (a note may wrap)."""
    rows = [line.rstrip() for line in output.splitlines() if "│" in line or "┃" in line]
    assert rows and max(len(row) for row in rows) <= columns, output


def _schedules(tmp_path: Path) -> tuple[dict[str, str], list[str]]:
    """A schedule with a long name and two runs; the environment and the runs' job ids."""
    config = write_project(tmp_path, {LONG: {**RENDER, "every": "1m", "concurrency": "allow"}})
    url = f"sqlite:///{tmp_path}/state.db"
    store = open_store(url)
    try:
        table = ScheduleTable(store)
        now = time.time()
        table.states([LONG], now - 3600)
        base = (now - 600) // 60 * 60
        for minute in range(2):
            table.fire(LONG, base + 60 * minute, base + 60 * minute, "allow", NEW)
        ids = [job.id for job in store.list_jobs()]
    finally:
        store.close()
    return {"SPKY_CONFIG": str(config), "SPKY_STORE": url}, ids


def test_schedules_list_and_get_cut_no_name_or_id_on_80_columns_or_in_a_pipe(
    tmp_path: Path,
) -> None:
    env, ids = _schedules(tmp_path)
    assert len(ids) == 2
    listed = run(tmp_path, "schedules", "list", env=env)
    _whole(listed, LONG)
    _within(listed, 80)
    got = run(tmp_path, "schedules", "get", LONG, env=env)
    _whole(got, LONG, *ids)
    piped_env = {**env, "COLUMNS": "80"}  # a pipe: as wide as a line needs, whatever COLUMNS says
    for args in (("schedules", "list"), ("schedules", "get", LONG)):
        piped = cli_process(*args, cwd=tmp_path, env=piped_env)
        assert piped.returncode == 0, piped.stderr
        _whole(piped.stdout, LONG)
    _whole(cli_process("schedules", "get", LONG, cwd=tmp_path, env=piped_env).stdout, *ids)
    # every row's id on one line with its status
    for job_id in ids:
        assert re.search(rf"pending\s+│\s+{re.escape(job_id)}", got), got


def test_the_jobs_dashboard_keeps_ids_and_status_on_80_columns(tmp_path: Path) -> None:
    folder = example_project(tmp_path / "project")
    url = f"sqlite:///{folder}/.sp00ky/state.db"
    (folder / ".sp00ky").mkdir()
    store = open_store(url)
    try:
        ids = [store.enqueue(render_job(payload={"gameId": n}), time.time()).id for n in "ab"]
        store.kill(ids[0], time.time())
    finally:
        store.close()
    dashboard = Terminal(folder, "jobs", "--store", url, "--refresh", "0.2")
    try:
        dashboard.wait_for(r"recent jobs")
        time.sleep(0.5)  # a refresh or two
        dashboard.proc.send_signal(signal.SIGINT)
        dashboard.wait(timeout=20)
    finally:
        dashboard.stop()
    shown = dashboard.output
    _whole(shown, *ids)
    _within(shown, 80)
    assert re.search(rf"{re.escape(ids[0])}\s+│\s+failed", shown), shown
    assert re.search(rf"{re.escape(ids[1])}\s+│\s+pending", shown), shown
    listed = cli_process("jobs", "list", "--store", url, cwd=folder, env={"COLUMNS": "40"})
    assert listed.returncode == 0, listed.stderr
    _whole(listed.stdout, *ids)
    assert [job["id"] for job in json.loads(
        cli_process("jobs", "list", "--store", url, "--json", cwd=folder).stdout
    )] == ids[::-1]  # fmt: skip
