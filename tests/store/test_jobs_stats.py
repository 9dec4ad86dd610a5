"""Counters you can read: the hourly counters retention folds rows into, from the store,
`jobs stats` and the admin API's GET /stats."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from sp00ky_infra.store import NewJob, SqlStore, open_store
from sp00ky_infra.store.retention import since_time
from tests.controllers import backend_app, project, running_controller
from tests.helpers import ROOT, cli

HOUR = 3600.0


def _finish(store: SqlStore, table: str, at: float, ok: bool) -> None:
    job = store.enqueue(
        NewJob(backend="renderer", table=table, path="/render", max_retries=0), at - 1
    )
    (running,) = store.claim(table, 1, "c", at - 1, 90.0, machine="m1")
    assert running.id == job.id and running.attempt is not None
    if ok:
        store.complete(job.id, running.attempt, {}, at)
    else:
        store.fail_attempt(job.id, running.attempt, {"code": "backend_error", "reason": "500"}, at)


def _history(store: SqlStore, now: float) -> None:
    """Five finished jobs over three hours and two tables, all pruned into the counters."""
    base = (now // HOUR) * HOUR  # this hour's start
    _finish(store, "render_job", base - 2 * HOUR + 10, ok=True)
    _finish(store, "render_job", base - 2 * HOUR + 20, ok=False)
    _finish(store, "render_job", base - HOUR + 5, ok=True)
    _finish(store, "render_job", base - HOUR + 6, ok=True)
    _finish(store, "mail_job", base + 1, ok=True)
    report = store.prune(base + 2, success_window=0.5, failed_window=0.5)
    assert report.total == 5


def test_counters_since_an_hour(store: SqlStore) -> None:
    now = 1_700_000_000.0
    _history(store, now)
    base = (now // HOUR) * HOUR
    everything = [(c.table, c.hour, c.outcome, c.count) for c in store.counters()]
    assert everything == [
        ("mail_job", base, "success", 1),
        ("render_job", base - 2 * HOUR, "failed", 1),
        ("render_job", base - 2 * HOUR, "success", 1),
        ("render_job", base - HOUR, "success", 2),
    ]
    # the hour `since` falls in counts; earlier hours do not
    recent = store.counters(since=base - HOUR + 1800)
    assert [(c.table, c.hour) for c in recent] == [("mail_job", base), ("render_job", base - HOUR)]
    assert [c.count for c in store.counters(table="render_job", since=base - HOUR)] == [2]


def test_since_takes_a_duration_a_date_or_a_unix_time() -> None:
    now = 1_700_000_000.0
    assert since_time("24h", now) == now - 86400
    assert since_time("2023-11-14", now) == 1_699_920_000.0
    assert since_time("2023-11-14T22:13", now) == 1_699_999_980.0
    assert since_time("1699990000", now) == 1_699_990_000.0
    assert since_time(None, now) is None
    with pytest.raises(ValueError, match="'soon' is neither a duration"):
        since_time("soon", now)


@pytest.fixture
def folder(tmp_path: Path, store_url: str) -> tuple[Path, dict[str, str]]:
    shutil.copytree(ROOT / "examples", tmp_path / "project",
                    ignore=shutil.ignore_patterns(".sp00ky"))  # fmt: skip
    return tmp_path / "project", {"SPKY_STORE": store_url, "SPKY_CONFIG": ""}


def test_jobs_stats_prints_the_counters(folder: tuple[Path, dict[str, str]]) -> None:
    store = open_store(folder[1]["SPKY_STORE"])
    try:
        _history(store, time.time())
    finally:
        store.close()
    shown: dict[str, Any] = json.loads(
        cli("jobs", "stats", "--json", cwd=folder[0], env=folder[1]).stdout
    )
    assert shown["since"] is None and len(shown["hours"]) == 4
    assert shown["totals"] == [
        {"table": "mail_job", "outcome": "success", "count": 1},
        {"table": "render_job", "outcome": "failed", "count": 1},
        {"table": "render_job", "outcome": "success", "count": 3},
    ]
    assert {"table", "hour", "hour_utc", "outcome", "count"} == set(shown["hours"][0])

    this_hour = time.strftime("%Y-%m-%dT%H:00", time.gmtime(time.time()))
    recent = json.loads(
        cli("jobs", "stats", "--since", this_hour, "--json", cwd=folder[0], env=folder[1]).stdout
    )
    assert [(h["table"], h["count"]) for h in recent["hours"]] == [("mail_job", 1)]

    text = cli("jobs", "stats", cwd=folder[0], env=folder[1]).stdout
    assert "jobs folded by retention, per hour (UTC)" in text
    assert "totals: mail_job success 1, render_job failed 1, render_job success 3" in text

    empty = cli("jobs", "stats", "--table", "none_job", cwd=folder[0], env=folder[1])
    assert empty.stdout.startswith("no counters: retention folds finished rows into them")
    wrong = cli("jobs", "stats", "--since", "soon", cwd=folder[0], env=folder[1])
    assert wrong.returncode == 2 and "'soon' is neither a duration" in wrong.stderr


@pytest.mark.parametrize("store_url", ["sqlite"], indirect=True)
def test_the_admin_api_serves_the_counters(tmp_path: Path, store_url: str) -> None:
    store = open_store(store_url)
    try:
        _history(store, time.time())
    finally:
        store.close()
    config = project(
        tmp_path / "p",
        {"render": {"autoscale": True, "min": 0, "max": 1}},
        {"renderer": backend_app("render", "render_job", tmp_path / "log.jsonl")},
    )
    with running_controller(tmp_path / "p", config, store_url) as controller:
        answer = controller.admin("GET", "/stats")
        assert answer.status_code == 200
        assert [t["count"] for t in answer.json()["totals"]] == [1, 1, 3]
        base = (time.time() // HOUR) * HOUR
        some = controller.admin("GET", "/stats", params={"since": str(base - HOUR)})
        assert [(h["table"], h["count"]) for h in some.json()["hours"]] == [
            ("mail_job", 1),
            ("render_job", 2),
        ]
        one = controller.admin("GET", "/stats", params={"table": "mail_job"})
        assert [h["count"] for h in one.json()["hours"]] == [1]
        bad = controller.admin("GET", "/stats", params={"since": "soon"})
        assert bad.status_code == 409 and "'soon' is neither a duration" in bad.json()["error"]
