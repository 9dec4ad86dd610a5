"""The SQLite dialect: the embedded default (WAL; one connection per thread).

``BEGIN IMMEDIATE`` takes the database's write lock at the start of every write transaction,
so writers are serialized and a claim's read-then-update cannot interleave with another's.
The threads of one process first queue on a lock of their own, and processes on a file lock
beside the database (``WriterQueue``), waiting in a blocking flock: SQLite's busy handler
sleeps 1, 2, 5, 10 ms... between tries, and a writer that meets another at ``BEGIN`` would
sleep while the database is free. SQLite's own lock stays what serializes writers: the
queue only spares them the sleeps, and a writer that cannot take it in BUSY_TIMEOUT_MS goes
on without it.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import os
import select
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from pathlib import Path
from typing import Any, TypeVar

from sp00ky_infra.policy.jobs import Queued, admit
from sp00ky_infra.store.dialect import Cursor, Later, LeaderLock, PerThread, Sql, Watcher
from sp00ky_infra.store.migrations import Migration
from sp00ky_infra.store.model import Conflict, StoreUnavailable
from sp00ky_infra.store.rows import (
    COMPLETE_ATTEMPT,
    QUEUE_ORDER,
    START_ROWS_MAX,
    Claim,
    Claimed,
    chunks,
    complete_attempts,
    start_attempts,
)
from sp00ky_infra.store.sql import SqlStore
from sp00ky_infra.store.transitions import attempt_deadline, new_attempt_id

log = logging.getLogger("sp00ky.store")
T = TypeVar("T")

WATCH_INTERVAL_SECONDS = 0.005  # data_version is read this often, wake-up or not
# ... and this often by a watcher whose process takes the wake-ups on another (wakeups=False)
BACKSTOP_INTERVAL_SECONDS = 0.05
MAX_SOCKET_PATH = 100  # sockaddr_un holds 108 bytes: a longer path has no wake-ups, only reads
WAKE_BYTES = 4096  # a wake-up's tables at most; a longer list is sent as a plain "look"


class DataVersionWatcher(Watcher):
    """Sees other connections' commits: ``PRAGMA data_version`` changes when one commits (a
    read of shared memory, no disk I/O), read every few milliseconds, and a wake-up at once
    for the commits that queue or requeue work.

    The wake-up is SQLite's stand-in for PostgreSQL's NOTIFY: each watcher binds a Unix
    datagram socket in ``<database>.wake/``, and a writer whose commit changed what
    watchers wait for sends every socket there one datagram after it commits
    (``WakeSender``): the tables whose queues got work due now, one a line, or nothing
    at all for "look" (a kill, work not yet due). So a job's wait for the controller to
    see it is a context switch, not half a polling interval, and a wake-up that names its
    table needs no read of the store to know whose polls to wake. A lost or missing
    datagram costs only that: the data_version read finds the commit within
    WATCH_INTERVAL_SECONDS. A watcher made with ``wakeups=False`` binds no socket and only
    reads, every BACKSTOP_INTERVAL_SECONDS: the controller's dispatcher thread, when its
    event loop takes the wake-ups on a watcher of its own (``fileno()``); its reads are then
    a backstop, and fewer of them leave the loop the CPU."""

    _count = itertools.count()

    def __init__(self, path: str, wakeups: bool = True) -> None:
        self._conn = sqlite3.connect(path, check_same_thread=False)
        self._last = self._version()
        self._socket: socket.socket | None = None
        self._interval = WATCH_INTERVAL_SECONDS if wakeups else BACKSTOP_INTERVAL_SECONDS
        self._address = os.path.join(wake_folder(path), f"{os.getpid()}.{next(self._count)}")
        if wakeups and len(os.fsencode(self._address)) <= MAX_SOCKET_PATH:
            with contextlib.suppress(OSError):
                os.makedirs(os.path.dirname(self._address), mode=0o700, exist_ok=True)
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                sock.setblocking(False)
                try:
                    sock.bind(self._address)
                except OSError:
                    sock.close()
                    raise
                self._socket = sock

    def _version(self) -> int:
        return int(self._conn.execute("PRAGMA data_version").fetchone()[0])

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            self.drain()  # before the read: a wake-up sent after it is for a later commit
            version = self._version()
            if version != self._last:
                self._last = version
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            pause = min(left, self._interval)
            if self._socket is None:
                time.sleep(pause)
            else:
                select.select([self._socket], [], [], pause)

    def fileno(self) -> int | None:
        return None if self._socket is None else self._socket.fileno()

    def drain(self) -> frozenset[str] | None:
        tables: set[str] = set()
        look = False
        if self._socket is not None:
            with contextlib.suppress(OSError):  # BlockingIOError: none (left)
                while True:
                    data = self._socket.recv(WAKE_BYTES)
                    if not data or len(data) >= WAKE_BYTES:  # "look", or cut short
                        look = True
                    else:
                        tables.update(data.decode("utf-8", "replace").split("\n"))
        return None if look or not tables else frozenset(tables)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            with contextlib.suppress(OSError):
                os.unlink(self._address)
        self._conn.close()


def wake_folder(path: str) -> str:
    """Where the watchers of the database at ``path`` bind their sockets."""
    return f"{path}.wake"


def wake_message(due: frozenset[str]) -> bytes:
    """A wake-up's datagram: ``due``, the tables with work due now, one a line; empty (the
    watchers look at everything) when there are none, or when they would not fit."""
    if any("\n" in table for table in due):
        return b""
    message = "\n".join(sorted(due)).encode()
    return message if len(message) < WAKE_BYTES else b""


class WakeSender:
    """A process's wake-ups of one database's watchers: one datagram (``wake_message``) to
    every socket in its ``wake_folder``. Never raises: a wake-up is only a hint.

    The socket it sends from is kept, and so is the folder's listing, read again when the
    folder's mtime changed or the listing is RESCAN_SECONDS old (an mtime can stay the same
    across two changes close together), or a send found a socket gone: a commit's wake-up
    is a stat and a send a watcher, not a listing and a socket of its own each time. A
    watcher bound since the last listing misses wake-ups for that long at most; its store's
    reads find the commits meanwhile. A socket nobody holds any more (a killed controller's)
    is removed."""

    RESCAN_SECONDS = 1.0

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self._lock = threading.Lock()
        self._pid = 0  # the process the socket and the listing are this one's
        self._sock: socket.socket | None = None
        self._paths: list[str] = []
        self._listed: tuple[int, float] | None = None  # (the folder's mtime, when), if current

    def send(self, message: bytes) -> None:
        try:
            changed = os.stat(self.folder).st_mtime_ns
        except OSError:  # no watcher ever bound here
            return
        with self._lock:
            now = time.monotonic()
            listed = self._listed
            if self._pid != os.getpid():  # new, or forked: nothing of the parent's
                self._sock, self._pid, listed = None, os.getpid(), None
            if listed is None or listed[0] != changed or now - listed[1] > self.RESCAN_SECONDS:
                try:
                    self._paths = [entry.path for entry in os.scandir(self.folder)]
                except OSError:
                    return
                self._listed = (changed, now)
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.setblocking(False)
            sock, paths = self._sock, self._paths
        for path in paths:
            try:
                sock.sendto(message, path)
            except (ConnectionRefusedError, FileNotFoundError):
                with contextlib.suppress(OSError):
                    os.unlink(path)
                self._listed = None  # list the folder again next time
            except OSError:  # full (it has a wake-up waiting already), or not a socket
                pass

    def close(self) -> None:
        with self._lock:
            if self._sock is not None and self._pid == os.getpid():
                self._sock.close()
            self._sock, self._listed = None, None


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
# Page cache a connection, under SQLite's default: the controller has a connection a thread,
# each one's cache fills on a large database, and the OS keeps the file's pages anyway.
CACHE_KIB = 512
# A store that checkpoints in the background (``checkpoint_in_background``: the controller's)
# has a thread copy the WAL back into the database every CHECKPOINT_INTERVAL_SECONDS when
# something was written, so that no commit pays for a checkpoint's fsync: no store's commits
# checkpoint below BACKSTOP_CHECKPOINT_PAGES, the controller's or another process's (a
# client's, the CLI's). Without a controller the last connection to close checkpoints, and
# a process that writes more meanwhile, at the backstop.
CHECKPOINT_INTERVAL_SECONDS = 0.1
BACKSTOP_CHECKPOINT_PAGES = 10_000


class WriterQueue:
    """The writers of a database across processes, one at a time: an exclusive flock on a
    file beside it, opened once a process (a descriptor inherited across fork would share
    its lock with the parent).

    A writer that finds the lock taken waits in a blocking flock, so the kernel hands it
    the lock the moment the holder lets go, with a timeout: the blocking call is made by
    a thread of the process's own (``_Waiter``), which a writer waits for up to its
    timeout. Trying again in a loop instead would take the holder's CPU.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = 0
        self._waiter: _Waiter | None = None

    def acquire(self, timeout: float) -> bool:
        """Take the lock, waiting up to ``timeout`` seconds; False if it could not."""
        try:
            if self._fd is None or self._pid != os.getpid():
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
                self._pid = os.getpid()
                self._waiter = _Waiter(self._fd)
        except OSError:
            return False
        assert self._waiter is not None
        return self._waiter.acquire(timeout)

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)


class _Waiter:
    """One process's side of a WriterQueue: its descriptor's flock, taken at once when it
    is free, else by a thread blocked in flock for the writer that waits (one at a time:
    the store's own lock queues the process's threads). The thread ends after IDLE_SECONDS
    with nobody waiting.

    Every flock of the descriptor but the holder's release is made under ``_state``: an
    exclusive flock a description already holds succeeds again, so a writer's try must
    not meet the lock the thread took for a writer that gave up, before the thread lets
    it go."""

    IDLE_SECONDS = 1.0

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._state = threading.Condition()
        self._blocked = False  # the thread is asked to wait in flock, or waits in it
        self._wanted = False  # ... for a writer still waiting
        self._answer: bool | None = None  # ... which it took (True) or could not (False)
        self._thread: threading.Thread | None = None

    def acquire(self, timeout: float) -> bool:
        with self._state:
            if not self._blocked:
                try:
                    fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return True
                except BlockingIOError:
                    pass
                except OSError:
                    return False
                self._blocked = True
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="sp00ky-sqlite-writers", daemon=True
                    )
                    self._thread.start()
                self._state.notify_all()
            self._wanted, self._answer = True, None
            self._state.wait_for(lambda: self._answer is not None, timeout)
            taken = bool(self._answer)
            self._wanted, self._answer = False, None
            return taken

    def _run(self) -> None:
        while True:
            with self._state:
                if not self._state.wait_for(lambda: self._blocked, self.IDLE_SECONDS):
                    self._thread = None
                    return
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
                taken = True
            except OSError:
                taken = False
            with self._state:
                self._blocked = False
                if self._wanted:
                    self._answer = taken
                    self._state.notify_all()
                elif taken:  # its writer gave up: the lock goes on to the next process
                    with contextlib.suppress(OSError):
                        fcntl.flock(self._fd, fcntl.LOCK_UN)


class Checkpointer(threading.Thread):
    """Checkpoints the WAL (PASSIVE: it waits for no reader or writer) every ``interval``
    seconds when another connection has committed since, on a connection of its own, until
    ``stop()``."""

    def __init__(self, path: str, interval: float = CHECKPOINT_INTERVAL_SECONDS) -> None:
        super().__init__(name="sqlite-checkpointer", daemon=True)
        self.path = path
        self.interval = interval
        self._halt = threading.Event()

    def run(self) -> None:
        try:
            conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")  # as the store's (memory)
        except sqlite3.Error:
            log.exception(
                "checkpointer: cannot open %s; commits checkpoint past the backstop", self.path
            )
            return
        seen = None
        try:
            while not self._halt.wait(self.interval):
                try:
                    version = conn.execute("PRAGMA data_version").fetchone()[0]
                    if version != seen:
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                        seen = version
                except sqlite3.Error:  # the next round tries again; the backstop still holds
                    log.warning("checkpointer: checkpoint of %s failed", self.path, exc_info=True)
        finally:
            conn.close()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive() and threading.current_thread() is not self:
            self.join(timeout=5)


class SqliteStore(SqlStore):
    name = "sqlite"
    embedded = True

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
        self._writers = WriterQueue(f"{path}.writers")  # and the processes'
        # What this thread's transaction will wake the watchers for once it commits: the
        # tables with work due now (empty: look at everything); None: nothing
        self._wake_due = threading.local()
        self._checkpointer: Checkpointer | None = None
        self._waker = WakeSender(wake_folder(path))

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
            conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
            conn.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_CHECKPOINT_PAGES}")
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open SQLite store {self.path}: {exc}") from exc
        return conn

    def _connection(self) -> sqlite3.Connection:
        return self._connections.get()

    @contextmanager
    def write(self) -> Iterator[Sql]:
        conn = self._connection()
        cur = conn.cursor()
        nested = conn.in_transaction  # inside transaction(): a savepoint of it
        queued = False
        if not nested:
            self._writer.acquire()
            queued = self._writers.acquire(BUSY_TIMEOUT_MS / 1000)
            self._wake_due.due = None  # left by a transaction that rolled back
        try:
            cur.execute("SAVEPOINT nested" if nested else "BEGIN IMMEDIATE")
            try:
                yield Sql(cur, self)
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
            if queued:
                self._writers.release()
            if not nested:
                self._writer.release()
        due = getattr(self._wake_due, "due", None)
        if not nested and due is not None:
            self._wake_due.due = None
            # committed: now the watchers can see it
            self._waker.send(wake_message(due))

    @contextmanager
    def read(self) -> Iterator[Sql]:
        cur = self._connection().cursor()
        try:
            yield Sql(cur, self)
        finally:
            cur.close()

    def _lock(self, cur: Cursor, key: str) -> None:
        """Nothing to do: BEGIN IMMEDIATE already serializes every writer."""

    def _own_statements(self, migration: Migration) -> tuple[str, ...]:
        return migration.sqlite

    def indexed(self, table: str, index: str) -> str:
        return f"{table} INDEXED BY {index}"

    def join_each(self, outer: str, table: str, on: str, where: str, index: str) -> str:
        return f"FROM {outer} JOIN {self.indexed(table, index)} ON {on} WHERE {where}"

    def each_queue(
        self, head: str, queues: Sequence[tuple[int, str, int]], now: float
    ) -> tuple[str, list[Any]]:
        # A subquery a queue, joined by UNION ALL: a LIMIT here names no outer column.
        one = "SELECT {n}, " + head.format(tbl="?", now="?", cap="?")
        sql = " UNION ALL ".join(one.format(n=n) for n, _, _ in queues)
        return sql, [value for _, table, cap in queues for value in (table, now, cap)]

    def claim_head(self, claim: Claim, shape: Claimed[T]) -> Later[list[T]]:
        """Read the head of the queue (BEGIN IMMEDIATE holds the database, so the rows read
        are the rows written), admit as policy.jobs.admit does, and start the admitted rows;
        the answers are built from the rows read (``shape.made``), not read back."""
        # ``+run_after`` keeps SQLite on jobs_queue, already in admission order, off
        # jobs_pending_due, whose range it would rather take and then sort every due row.
        head = (
            f"SELECT {shape.head} FROM jobs "
            "WHERE tbl = ? AND status = 'pending' AND +run_after <= ? "
            "AND (queue_deadline IS NULL OR queue_deadline > ?) "
            f"ORDER BY {QUEUE_ORDER} LIMIT ?"
        )
        now, slots_at, timeout_at, duration_at = claim.now, *shape.places
        with self.joined() as sql:
            in_flight = 0
            if claim.concurrency is not None:
                running = "SELECT count(*) FROM jobs WHERE tbl = ? AND status = 'processing'"
                in_flight = int(sql.execute(running, (claim.table,)).fetchone()[0])
            queue = sql.execute(head, (claim.table, now, now, claim.free_slots)).fetchall()
            queued = (Queued(row[0], row[slots_at]) for row in queue)
            chosen = set(admit(queued, claim.free_slots, in_flight, claim.concurrency))
            started: list[T] = []
            starts = []
            for row in queue:
                if row[0] in chosen:
                    attempt = new_attempt_id()
                    deadline = attempt_deadline(row[timeout_at], row[duration_at], now)
                    starts.append((row[0], attempt, deadline))
                    started.append(shape.made(row, claim, attempt, deadline))
            lease_expires_at = now + claim.lease
            for chunk in chunks(starts, START_ROWS_MAX):
                sql.execute(
                    start_attempts(len(chunk)),
                    (claim.owner, claim.machine, lease_expires_at, now, now, *chain(*chunk)),
                )
                if sql.rowcount != len(chunk):  # the database is held: every admitted row starts
                    raise Conflict(f"claim of {claim.table} raced another writer; try again")
        return Later.ready(started)

    def renew_leases(
        self, leases: Sequence[tuple[str, str]], now: float, lease: float
    ) -> Later[set[str]]:
        renewed: set[str] = set()
        with self.joined() as sql:  # each UPDATE stands alone: no savepoint needed
            for job_id, attempt in leases:
                sql.execute(
                    "UPDATE jobs SET lease_expires_at = ?, updated_at = ? "
                    "WHERE id = ? AND attempt = ? AND status = 'processing'",
                    (now + lease, now, job_id, attempt),
                )
                if sql.rowcount == 1:
                    renewed.add(job_id)
        return Later.ready(renewed)

    def end_attempts(
        self, results: Sequence[tuple[str, str, str | None]], now: float, machine: str | None
    ) -> Later[dict[str, float | None]]:
        """A statement a chunk of START_ROWS_MAX results (the one-row statement for one
        result), committed together."""
        started: dict[str, float | None] = {}
        with self.joined() as sql:
            if len(results) > 1:
                for chunk in chunks(results, START_ROWS_MAX):
                    sql.execute(
                        complete_attempts(len(chunk)), (now, now, *chain(*chunk), machine, machine)
                    )
                    started.update(sql.fetchall())
                return Later.ready(started)
            ((job_id, attempt, payload),) = results
            row = sql.execute(
                COMPLETE_ATTEMPT, (payload, now, now, job_id, attempt, machine, machine)
            ).fetchone()
            if row is not None:
                started[job_id] = row[0]
        return Later.ready(started)

    def leader_lock(self) -> LeaderLock:
        return FileLock(f"{self.path}.leader")

    def watch(self, wakeups: bool = True) -> Watcher:
        return DataVersionWatcher(self.path, wakeups)

    def _changed(self, cur: Cursor, due: Sequence[str] = ()) -> None:
        """Wake the watchers once this commits (at once outside a transaction: committed)."""
        tables = frozenset(due)
        if self._connection().in_transaction:
            pending = getattr(self._wake_due, "due", None)
            if pending is not None:  # a look wins; due tables add up
                tables = pending | tables if pending and tables else frozenset()
            self._wake_due.due = tables
        else:
            self._waker.send(wake_message(tables))

    def checkpoint_in_background(self) -> None:
        """Checkpoint the WAL on a thread of this store's (``Checkpointer``) until
        ``close()``: the commits of every store leave it to such a thread up to
        BACKSTOP_CHECKPOINT_PAGES."""
        if self._checkpointer is not None:
            return
        self._checkpointer = Checkpointer(self.path)
        self._checkpointer.start()

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        self._waker.close()
        self._connections.close_all()

    def __repr__(self) -> str:
        return f"SqliteStore({self.path!r})"
