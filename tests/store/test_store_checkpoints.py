"""SQLite's WAL checkpoints kept off the commits: the controller's store copies the WAL back on
a thread of its own, and every store's commits (the controller's, a client's) checkpoint only
past a backstop."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

from sp00ky_infra.controller.server import Runtime
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.store import SqlStore, open_store
from sp00ky_infra.store.sqlite import BACKSTOP_CHECKPOINT_PAGES
from tests.controllers import ADMIN_TOKEN, SECRET, backend_app, project, wait_for
from tests.store.test_store_contract import T0, new


def _autocheckpoint(store: SqlStore) -> int:
    with store.read() as cur:
        cur.execute("PRAGMA wal_autocheckpoint")
        return int(cur.fetchone()[0])


def _in_the_database_file(path: Path) -> int:
    """The jobs the database file itself holds: ``immutable`` reads it without its WAL, so
    only what a checkpoint copied back counts."""
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return int(conn.execute("SELECT count(*) FROM jobs").fetchone()[0])
    except sqlite3.OperationalError:  # not even the migrations' tables reached it yet
        return 0
    except sqlite3.DatabaseError:  # "malformed": a page a checkpoint is writing this moment
        return -1  # (immutable reads take no lock): the caller's wait reads again
    finally:
        conn.close()


def _checkpointers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "sqlite-checkpointer" and t.is_alive()]


def test_the_thread_copies_the_wal_back_and_the_commits_leave_it_to_the_thread(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    store = open_store(f"sqlite:///{path}")
    other = open_store(f"sqlite:///{path}")  # another process's, the CLI's: as SQLite has it
    try:
        store.checkpoint_in_background()
        assert _autocheckpoint(store) == BACKSTOP_CHECKPOINT_PAGES
        assert _autocheckpoint(other) == BACKSTOP_CHECKPOINT_PAGES  # a client's, the CLI's

        before = _in_the_database_file(path)
        store.enqueue_many([new(payload={"n": n}) for n in range(50)], T0)
        wait_for(
            lambda: _in_the_database_file(path) == before + 50,
            timeout=10,
            what="the checkpointer to copy the new rows into the database file",
        )
    finally:
        other.close()
        store.close()
    assert _checkpointers() == []  # close() stopped it


def test_a_clients_commits_past_sqlites_thousand_pages_do_not_checkpoint(tmp_path: Path) -> None:
    """SQLite's default would have the commit that takes the WAL past 1,000 pages copy it
    back, with an fsync, before the job it wrote could wake a poll: the client's run(). Its
    commits leave that to the controller's thread (above) or, with no controller, to the
    last connection's close."""
    path = tmp_path / "state.db"
    client = open_store(f"sqlite:///{path}")
    try:
        before = _in_the_database_file(path)
        blob = "x" * 100_000  # 25 pages a job: 60 jobs take the WAL past 1,000 pages
        for n in range(60):
            client.enqueue(new(payload={"n": n, "blob": blob}), T0)
        wal = (path.parent / f"{path.name}-wal").stat().st_size
        assert wal > 1_000 * 4096  # the WAL holds them all ...
        assert _in_the_database_file(path) == before  # ... and no commit copied them back
    finally:
        client.close()
    assert _in_the_database_file(path) == before + 60  # the last connection's close did


def test_without_it_small_commits_stay_in_the_wal(tmp_path: Path) -> None:
    # The control: the same writes, below SQLite's 1,000 pages, reach the database file only
    # at a checkpoint, which nothing runs here.
    path = tmp_path / "state.db"
    store = open_store(f"sqlite:///{path}")
    try:
        before = _in_the_database_file(path)
        store.enqueue_many([new(payload={"n": n}) for n in range(50)], T0)
        time.sleep(0.5)  # five of the checkpointer's rounds, had it one
        assert _in_the_database_file(path) == before
        assert _checkpointers() == []
    finally:
        store.close()


def test_a_controller_checkpoints_its_sqlite_store_in_the_background(tmp_path: Path) -> None:
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    config = project(tmp_path, {"render": {"min": 0, "autoscale": True, "max": 1}}, {"r": app})
    settings = ControllerSettings.from_env(
        {"SPKY_POOL_SECRET": SECRET, "SPKY_ADMIN_TOKEN": ADMIN_TOKEN, "SPKY_POOL_PROVIDER": "local",
         "SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0"},
        config_path=str(config), store_url=f"sqlite:///{tmp_path}/state.db",
        state_dir=str(tmp_path / "dev"),
    )  # fmt: skip
    runtime = Runtime(settings)
    try:
        assert _autocheckpoint(runtime.controller.store) == BACKSTOP_CHECKPOINT_PAGES
        assert len(_checkpointers()) == 1
    finally:
        runtime.close()
    assert _checkpointers() == []
