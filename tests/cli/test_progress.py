"""Progress where work is long: jobs clear / prune on large tables and
guardian passes over many servers show a bar on a terminal (a pty here) and stay quiet in
--json and in pipes."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sp00ky_infra.rehearse.cloud import TOKEN, FakeHetzner
from sp00ky_infra.store import NewJob, SqlStore, open_store
from sp00ky_infra.store.dialect import DEFAULT_BATCH
from tests.helpers import ROOT, cli, on_a_terminal

T0 = 1_700_000_000.0


def _finished(store: SqlStore, count: int, at: float = T0) -> None:
    news = [NewJob(backend="renderer", table="render_job", path="/render")] * count
    for job_id in store.enqueue_many(news, at):
        store.kill(job_id, at + 1)


def test_clear_and_prune_tell_each_committed_batch(store: SqlStore) -> None:
    _finished(store, 250)
    told: list[int] = []
    assert store.clear(batch=100, progress=told.append) == 250
    assert told == [100, 100, 50]
    _finished(store, 120)
    told.clear()
    report = store.prune(T0 + 10**6, 60.0, 60.0, batch=50, progress=told.append)
    assert report.total == 120 and told == [50, 50, 20]
    _finished(store, 30)
    told.clear()
    assert len(store.clear_jobs(limit=25, batch=10, progress=told.append)) == 25
    assert told == [10, 10, 5]


@pytest.fixture
def big_project(tmp_path: Path) -> Iterator[tuple[Path, dict[str, str]]]:
    folder = tmp_path / "project"
    shutil.copytree(ROOT / "examples", folder, ignore=shutil.ignore_patterns(".sp00ky"))
    url = f"sqlite:///{tmp_path}/state.db"
    store = open_store(url)
    try:
        _finished(store, 2 * DEFAULT_BATCH + 100, at=time.time() - 30 * 86400)
    finally:
        store.close()
    yield folder, {"SPKY_STORE": url, "SPKY_CONFIG": ""}


def test_clear_shows_progress_on_a_terminal_only(
    big_project: tuple[Path, dict[str, str]],
) -> None:
    folder, env = big_project
    rows = 2 * DEFAULT_BATCH + 100
    code, text = on_a_terminal(["jobs", "clear", "--yes", "--limit", "1000"], folder, env)
    assert code == 0, text
    assert "deleting finished jobs" in text and "1000/1000" in text
    assert "deleted 1000 finished job(s)" in text
    piped = cli("jobs", "clear", "--yes", "--limit", "10", cwd=folder, env=env)
    assert piped.stdout == "deleted 10 finished job(s)\n" and piped.stderr == ""
    code, text = on_a_terminal(["jobs", "clear", "--yes", "--json"], folder, env)
    assert code == 0 and "deleting finished jobs" not in text
    assert len(json.loads(text)) == rows - 1010  # the whole output is the JSON


def test_prune_shows_progresson_a_terminal(big_project: tuple[Path, dict[str, str]]) -> None:
    folder, env = big_project
    code, text = on_a_terminal(["jobs", "prune"], folder, env)
    assert code == 0, text
    rows = 2 * DEFAULT_BATCH + 100
    assert "pruning finished jobs" in text and f"{rows}/?" in text
    assert f"pruned {rows} job(s) ({rows} failed)" in text


def test_a_guardian_pass_shows_progress_on_a_terminal_and_not_in_json() -> None:
    with FakeHetzner() as fake:
        old = datetime.now(UTC) - timedelta(hours=80)
        labels = {"sp00ky/project": "shop", "sp00ky/pool": "render", "sp00ky/machine": "m"}
        for n in range(40):
            fake.add_server(f"old-{n}", {**labels, "sp00ky/machine": f"old-{n}"}, old)
        env = {"HCLOUD_TOKEN": TOKEN, "HCLOUD_ENDPOINT": fake.url}
        code, text = on_a_terminal(["guardian", "--dry-run", "--json"], ROOT, env)
        assert code == 0 and "guardian:" not in text
        assert len(json.loads(text)["plan"]) == 40
        code, text = on_a_terminal(["guardian"], ROOT, env)
        assert code == 0, text
        assert "guardian: 40 machine(s) seen; destroying" in text and "40/40" in text
        assert "40 machine(s) seen; destroyed 40" in text and fake.servers == {}
