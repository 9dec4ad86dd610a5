"""The SQLite dialect: the embedded default (WAL; one connection per thread).

``BEGIN IMMEDIATE`` takes the database's write lock at the start of every write transaction,
so writers are serialized and a claim's read-then-update cannot interleave with another's.
The threads of one process first queue on a lock of their own: SQLite's busy handler sleeps
1, 2, 5, 10 ms... between tries, so two threads of the controller meeting at ``BEGIN``
would otherwise cost the loser milliseconds (measured: 12% of the controller's time under
load went to those sleeps). Other processes still meet SQLite's own lock, as before.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sp00ky_infra.store.dialect import Cursor, LeaderLock, PerThread, Watcher
from sp00ky_infra.store.model import StoreUnavailable
from sp00ky_infra.store.sql import SqlStore

WATCH_INTERVAL_SECONDS = 0.005  # idle: about 0.5% of a core
BUSY_WATCH_INTERVAL_SECONDS = 0.001  # within BUSY_SECONDS of a change: dispatch waits less
BUSY_SECONDS = 1.0


class DataVersionWatcher(Watcher):
    """Polls ``PRAGMA data_version``, which changes when another connection commits: a read
    of shared memory, no disk I/O, so every few milliseconds is cheap. For a second after a
    change it looks every millisecond (jobs come in bursts; a job's wait for the controller
    to see it is half the interval on average), then every 5 ms again."""

    def __init__(self, path: str) -> None:
        self._conn = sqlite3.connect(path, check_same_thread=False)
        self._last = self._version()
        self._changed_at = 0.0

    def _version(self) -> int:
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            version = self._version()
            now = time.monotonic()
            if version != self._last:
                self._last = version
                self._changed_at = now
                return True
            if now >= deadline:
                return False
            busy = now - self._changed_at < BUSY_SECONDS
            time.sleep(BUSY_WATCH_INTERVAL_SECONDS if busy else WATCH_INTERVAL_SECONDS)

    def close(self) -> None:
        self._conn.close()


class FileLock(LeaderLock):
    """An exclusive lock on a file beside the database (flock: freed when the process dies)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None

    def try_acquire(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


BUSY_TIMEOUT_MS = 30_000


class SqliteStore(SqlStore):
    def __init__(self, path: str) -> None:
        if path in ("", ":memory:"):
            raise StoreUnavailable(
                "an in-memory SQLite store cannot be shared between threads and processes; "
                "use a file: sqlite:///.sp00ky/state.db"
            )
        self.path = path
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot create the directory of {path}: {exc}") from exc
        self._connections = PerThread(self._connect)
        self._writer = threading.Lock()  # this process's writers, one at a time

    def _connect(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                isolation_level=None,
                timeout=BUSY_TIMEOUT_MS / 1000,
                check_same_thread=False,
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {exc}") from exc
        return conn

    def _connection(self) -> sqlite3.Connection:
        return self._connections.get()

    @contextmanager
    def _write(self) -> Iterator[Cursor]:
        conn = self._connection()
        cur = conn.cursor()
        nested = conn.in_transaction  # inside transaction(): a savepoint of it
        if not nested:
            self._writer.acquire()
        try:
            cur.execute("SAVEPOINT nested" if nested else "BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                if nested:
                    cur.execute("ROLLBACK TO nested")
                    cur.execute("RELEASE nested")
                else:
                    cur.execute("ROLLBACK")
                raise
            else:
                cur.execute("RELEASE nested" if nested else "COMMIT")
        finally:
            cur.close()
            if not nested:
                self._writer.release()

    @contextmanager
    def _cursor(self) -> Iterator[Cursor]:
        cur = self._connection().cursor()
        try:
            yield cur
        finally:
            cur.close()

    def _lock(self, cur: Cursor, key: str) -> None:
        """Nothing to do: BEGIN IMMEDIATE already serializes every writer."""

    def leader_lock(self) -> LeaderLock:
        return FileLock(f"{self.path}.leader")

    def watch(self) -> Watcher:
        return DataVersionWatcher(self.path)

    def _changed(self, cur: Cursor) -> None:
        """Nothing to send: watchers see every commit in PRAGMA data_version."""

    def close(self) -> None:
        self._connections.close_all()

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"
