"""A new PostgreSQL jobs table gets its first statistics from the controller's tick, not a
minute later from autovacuum: until then the planner guesses, and the generic plans it makes
meanwhile (the poll's batched statements) stay cached until the table is analyzed. On
PostgreSQL 15, the batched results' UPDATE on a never-analyzed table of 2,000 rows read every
row for each result; analyzed, it finds each row by id. SQLite has nothing to do."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.store import SqlStore, open_store
from sp00ky_infra.store.rows import COMPLETE_ATTEMPTS_PG
from tests.controller.test_controller_executor import Recording
from tests.controllers import backend_app, leading, project
from tests.store.test_store_layout import generic_plan
from tests.store.test_store_pipeline import _enqueue


def _new_store(url: str) -> SqlStore:
    """A store on a new schema, the jobs table left alone by autovacuum (which would otherwise
    analyze it whenever its minute comes round, as it may in these tests)."""
    store = open_store(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ALTER TABLE jobs SET (autovacuum_enabled = false)")
    return store


def _analyzed(url: str) -> tuple[int, float]:
    """How many times the jobs table was analyzed (by anyone), and its row estimate."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT s.analyze_count + s.autoanalyze_count, c.reltuples "
            "FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
            "WHERE s.relid = 'jobs'::regclass"
        ).fetchone()
    assert row is not None
    return int(row[0]), float(row[1])


def test_a_new_jobs_table_is_analyzed_once_it_holds_rows(postgres_url: str) -> None:
    store = _new_store(postgres_url)
    try:
        _enqueue(store, 49)  # under autovacuum's threshold (50): too few rows to tell much
        assert store.ensure_statistics() is False
        assert _analyzed(postgres_url)[0] == 0
        _enqueue(store, 1951)
        assert store.ensure_statistics() is True
        count, rows = _analyzed(postgres_url)
        assert (count, rows) == (1, 2000)
        plan = generic_plan(postgres_url, COMPLETE_ATTEMPTS_PG)
        assert "Index Scan using jobs_pkey on jobs" in plan, plan
        assert "Seq Scan on jobs" not in plan, plan
        # Once is enough: autovacuum keeps the statistics from there.
        _enqueue(store, 5000)
        assert store.ensure_statistics() is False
        assert _analyzed(postgres_url)[0] == 1
    finally:
        store.close()


def test_a_table_analyzed_before_is_not_analyzed_again(postgres_url: str) -> None:
    store = _new_store(postgres_url)
    try:
        _enqueue(store, 500)
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("ANALYZE jobs")
        assert store.ensure_statistics() is False
        assert _analyzed(postgres_url)[0] == 1
    finally:
        store.close()


@pytest.fixture
def controller(tmp_path: Path, postgres_url: str) -> Iterator[Controller]:
    """A leading controller on a new PostgreSQL store (its first tick already run)."""
    app = backend_app("render", "render_job", tmp_path / "log")
    pools = {"render": {"min": 0, "autoscale": True, "max": 1}}
    config = load_config(project(tmp_path, pools, {"renderer": app}))
    settings = ControllerSettings(secret="s", state_dir=str(tmp_path))
    store = _new_store(postgres_url)
    with leading(Controller(settings, config, store, Recording(delivers_join_token=True))) as made:
        yield made


def test_the_tick_analyzes_a_new_jobs_table(
    controller: Controller, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    assert _analyzed(postgres_url)[0] == 0  # the first tick found it empty
    _enqueue(controller.store, 300)
    with caplog.at_level(logging.INFO, logger="sp00ky.controller"):
        tick(controller)
    assert _analyzed(postgres_url) == (1, 300)
    assert "event=analyzed table=jobs" in caplog.text
    tick(controller)
    assert _analyzed(postgres_url)[0] == 1


def test_sqlite_has_no_statistics_to_make(sqlite_url: str) -> None:
    store = open_store(sqlite_url)
    try:
        _enqueue(store, 300)
        assert store.ensure_statistics() is False
        with store.read() as cur:
            cur.execute("SELECT count(*) FROM sqlite_master WHERE name = 'sqlite_stat1'")
            assert cur.fetchone()[0] == 0
    finally:
        store.close()
