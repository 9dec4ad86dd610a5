"""``sp00ky-infra schedules list|get``: next fire times and totals, as text and --json."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

from sp00ky_infra.store import NewJob, open_store
from sp00ky_infra.store.schedules import ScheduleTable
from tests.controller.test_schedules_controller import RENDER, write_project
from tests.helpers import cli

NEW = NewJob(backend="renderer", table="render_job", path="/render", payload={"gameId": "g"})


def setup(tmp_path: Path) -> dict[str, str]:
    config = write_project(
        tmp_path,
        {
            "nightly": {**RENDER, "cron": "0 3 * * *"},
            "sync": {**RENDER, "every": "1m", "concurrency": "skip"},
        },
    )
    url = f"sqlite:///{tmp_path}/state.db"
    store = open_store(url)
    try:
        table = ScheduleTable(store)
        now = time.time()
        table.states(["sync"], now - 3600)  # seen an hour ago; nightly never seen
        base = (now - 3000) // 60 * 60
        table.fire("sync", base, base, "skip", NEW)  # pending all along
        for minute in range(1, 4):  # skipped, and pruned below
            table.fire("sync", base + 60 * minute, base + 60 * minute, "skip", NEW)
        table.fire("sync", base + 240, base + 240, "skip", NEW)  # skipped, kept
        table.prune(base + 200 + 900, {"sync": (900, 86400)}, (86400, 86400))
    finally:
        store.close()
    return {"SPKY_CONFIG": str(config), "SPKY_STORE": url, "COLUMNS": "200"}


def test_list_shows_next_fire_times_and_totals(tmp_path: Path) -> None:
    env = setup(tmp_path)
    before = time.time()
    listed = cli("schedules", "list", "--json", env=env, cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    nightly, sync = json.loads(listed.stdout)
    assert (nightly["name"], nightly["cadence"], nightly["seen"]) == (
        "nightly",
        "cron 0 3 * * *",
        False,
    )
    upcoming = datetime.fromtimestamp(nightly["next_fire_at"], UTC)
    assert (upcoming.hour, upcoming.minute, upcoming.second) == (3, 0, 0)
    assert 0 < nightly["next_fire_at"] - before <= 86400
    assert sync["seen"] and sync["concurrency"] == "skip"
    assert sync["next_fire_at"] >= before  # overdue fires are the next tick's to make
    assert sync["totals"]["kept"]["pending"] == 1 and sync["totals"]["kept"]["skipped"] == 1
    assert sync["totals"]["pruned"]["skipped"] == 3
    text = cli("schedules", env=env, cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "nightly" in text.stdout and "cron 0 3 * * *" in text.stdout
    assert "1 pending  4 skipped" in text.stdout


def test_get_shows_runs_and_pruned_totals(tmp_path: Path) -> None:
    env = setup(tmp_path)
    got = cli("schedules", "get", "sync", "--json", env=env, cwd=tmp_path)
    assert got.returncode == 0, got.stderr
    data = json.loads(got.stdout)
    assert [run["status"] for run in data["runs"]] == ["skipped", "pending"]
    assert data["route"] == "/render" and data["payload"] == {"gameId": "nightly"}
    text = cli("schedules", "get", "sync", env=env, cwd=tmp_path)
    assert "pruned      : 0 ok  0 failed  3 skipped  0 replaced" in text.stdout
    assert "every 1m (UTC)" in text.stdout


def test_get_of_an_unknown_schedule_says_which_exist(tmp_path: Path) -> None:
    env = setup(tmp_path)
    missing = cli("schedules", "get", "nigthly", env=env, cwd=tmp_path)
    assert missing.returncode == 1
    assert missing.stderr.strip() == (
        "error: no schedule 'nigthly' in sp00ky.yml (schedules: nightly, sync); "
        "did you mean 'nightly'?"
    )


def test_pause_and_resume_are_kept_in_the_store_and_shown(tmp_path: Path) -> None:
    env = setup(tmp_path)
    paused = cli("schedules", "pause", "sync", env=env, cwd=tmp_path)
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith("schedule sync paused since ")
    data = json.loads(cli("schedules", "get", "sync", "--json", env=env, cwd=tmp_path).stdout)
    assert data["paused"] and data["paused_at"] is not None and data["next_fire_at"] is None
    text = cli("schedules", "get", "sync", env=env, cwd=tmp_path).stdout
    assert "paused      : since " in text and "next fire   : - (paused)" in text
    assert "paused since" in cli("schedules", env=env, cwd=tmp_path).stdout
    resumed = cli("schedules", "resume", "sync", env=env, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    data = json.loads(cli("schedules", "get", "sync", "--json", env=env, cwd=tmp_path).stdout)
    assert not data["paused"] and data["next_fire_at"] is not None
    unknown = cli("schedules", "pause", "synk", env=env, cwd=tmp_path)
    assert unknown.returncode == 1 and "did you mean 'sync'?" in unknown.stderr


def test_get_shows_a_fan_outs_query_and_its_runs_rows(tmp_path: Path) -> None:
    config = write_project(
        tmp_path,
        {
            "tenants": {
                **RENDER,
                "every": "1m",
                "payload": {},
                "forEach": {"query": 'SELECT id AS "gameId" FROM game', "key": "gameId"},
            }
        },
    )
    url = f"sqlite:///{tmp_path}/state.db"
    store = open_store(url)
    try:
        table = ScheduleTable(store)
        table.fail_fire("tenants", 60.0, 61.0, "the query failed: no such table: game")
    finally:
        store.close()
    env = {"SPKY_CONFIG": str(config), "SPKY_STORE": url, "COLUMNS": "200"}
    text = cli("schedules", "get", "tenants", env=env, cwd=tmp_path).stdout
    assert 'for each    : SELECT id AS "gameId" FROM game  (key gameId)' in text
    assert "the query failed: no such table: game" in text
