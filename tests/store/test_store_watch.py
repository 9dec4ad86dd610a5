"""A watcher sees another connection's change, at once in a burst and after a quiet spell."""

from __future__ import annotations

import contextlib
import os
import select
import socket
import time
from pathlib import Path

from sp00ky_infra.store import SqlStore
from sp00ky_infra.store.sqlite import DataVersionWatcher, SqliteStore
from tests.store.test_store_contract import T0, new


def test_a_watcher_wakes_for_each_new_job_and_not_without_one(store: SqlStore) -> None:
    watcher = store.watch()
    try:
        assert watcher.wait(0.05) is False  # nothing changed
        for _ in range(3):  # a burst: each change is seen
            store.enqueue(new(), T0)
            assert watcher.wait(5) is True
        time.sleep(1.2)  # quiet: the SQLite watcher slows down; a change is still seen
        store.enqueue(new(), T0)
        assert watcher.wait(5) is True
        assert watcher.wait(0.05) is False
    finally:
        watcher.close()


def test_a_sqlite_commit_wakes_a_watcher_of_another_process_at_once(tmp_path: Path) -> None:
    """The wake-up is sent after the commit (so the watcher's read finds the change), once
    per transaction that queued work, never for one that rolled back; a socket nobody holds
    any more (a killed controller's) is removed by the next writer."""
    path = str(tmp_path / "state.db")
    writer = SqliteStore(path)
    writer.migrate()
    watcher = DataVersionWatcher(path)
    try:
        assert watcher._socket is not None
        stale = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        stale.bind(str(tmp_path / "state.db.wake" / "1.0"))
        stale.close()  # bound, then nobody holds it: a dead watcher's socket
        assert not _pending(watcher)
        writer.enqueue(new(), T0)
        assert _pending(watcher)  # a datagram waits: no polling interval to sit out
        assert watcher.wait(0) is True  # and the commit is visible by then
        assert sorted(os.listdir(tmp_path / "state.db.wake")) == [
            os.path.basename(watcher._address)
        ]
        with contextlib.suppress(RuntimeError), writer.transaction():
            writer.enqueue(new(), T0)
            raise RuntimeError("rolled back")
        assert not _pending(watcher)
        assert watcher.wait(0.02) is False
    finally:
        watcher.close()
        writer.close()
    assert os.listdir(tmp_path / "state.db.wake") == []  # a closed watcher leaves no socket


def test_a_watcher_whose_socket_path_is_too_long_still_sees_commits(tmp_path: Path) -> None:
    folder = tmp_path / ("d" * 60) / ("e" * 60)
    folder.mkdir(parents=True)
    path = str(folder / "state.db")
    writer = SqliteStore(path)
    writer.migrate()
    watcher = DataVersionWatcher(path)
    try:
        assert watcher._socket is None  # no wake-up channel: data_version reads only
        writer.enqueue(new(), T0)
        assert watcher.wait(5) is True
    finally:
        watcher.close()
        writer.close()


def _pending(watcher: DataVersionWatcher) -> bool:
    assert watcher._socket is not None
    readable, _, _ = select.select([watcher._socket], [], [], 0)
    return bool(readable)
