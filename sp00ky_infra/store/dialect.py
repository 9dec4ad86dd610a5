"""The dialect core: connections, transactions, locking and migrations of a SQL store.

The concerns (``jobs.py``, ``sweep.py``, ``retention.py``, ``machines.py``) write their SQL once
against this core; the dialects (``sqlite.py``, ``postgres.py``) implement it.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Generic, Protocol, TypeVar

from sp00ky_infra.store.migrations import MIGRATIONS
from sp00ky_infra.store.model import StoreError


class Closable(Protocol):
    def close(self) -> None: ...


C = TypeVar("C", bound=Closable)
T = TypeVar("T")
U = TypeVar("U")
DEFAULT_BATCH = 500  # rows a sweep or a prune reads per round


class Cursor(Protocol):
    """What the store needs of a DB-API cursor (sqlite3 and psycopg both fit)."""

    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ..., /) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def executemany(self, sql: str, params: Sequence[Sequence[Any]], /) -> Any: ...


class Later(Generic[T]):
    """A statement's outcome, read when first asked for. Inside a PostgreSQL
    ``transaction()`` the statements sent before an ask travel together (a pipeline: one round
    trip for them all, the COMMIT's too for those read after it); elsewhere the statement ran
    when it was sent and this only holds what it gave."""

    __slots__ = ("_done", "_read", "_value")

    def __init__(self, read: Callable[[], T]) -> None:
        self._read = read
        self._done = False

    @classmethod
    def ready(cls, value: T) -> Later[T]:
        later = cls(lambda: value)
        later._value, later._done = value, True
        return later

    def result(self) -> T:
        if not self._done:
            self._value, self._done = self._read(), True
        return self._value

    def then(self, after: Callable[[T], U]) -> Later[U]:
        """The outcome with ``after`` applied to it (when asked for)."""
        return Later(lambda: after(self.result()))


class PerThread(Generic[C]):
    """One connection per thread (the stores' connections are not shared between threads),
    all of them closed together."""

    def __init__(
        self, connect: Callable[[], C], usable: Callable[[C], bool] = lambda _: True
    ) -> None:
        self._connect = connect
        self._usable = usable
        self._local = threading.local()
        self._opened: list[C] = []
        self._guard = threading.Lock()

    def get(self) -> C:
        conn: C | None = getattr(self._local, "conn", None)
        if conn is None or not self._usable(conn):
            conn = self._connect()
            self._local.conn = conn
            with self._guard:
                self._opened.append(conn)
        return conn

    def close_all(self) -> None:
        with self._guard:
            for conn in self._opened:
                conn.close()
            self._opened.clear()
        self._local = threading.local()


class LeaderLock(ABC):
    """Held by at most one controller of a store at a time; freed when its process dies."""

    @abstractmethod
    def try_acquire(self) -> bool:
        """Take the lock if it is free (never waits); True while this process holds it."""

    @abstractmethod
    def release(self) -> None: ...


class Watcher(ABC):
    """Tells a waiting process that the store changed (a job written, killed, retried)."""

    @abstractmethod
    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds; True if the store changed meanwhile."""

    @abstractmethod
    def close(self) -> None: ...

    def fileno(self) -> int | None:
        """A descriptor that turns readable when another process's commit asks for a look,
        for an event loop to wait on (then ``drain()``, and look); None: only ``wait()``
        sees changes."""
        return None

    def drain(self) -> frozenset[str] | None:
        """Consume the wake-ups ``fileno()`` has waiting: the tables whose queues they say
        got work due now, or None when any asks for a whole look (a kill, work not yet due,
        a writer that names nothing), or none names a table."""
        return None


class Dialect(ABC):
    """A SQL database on per-thread connections. Subclasses supply the dialect."""

    placeholder = "?"
    # Whether the database takes arrays as parameters: PostgreSQL writes a batch of rows in
    # one statement with the rows' values as arrays (one round trip); SQLite with them in
    # VALUES (rows.start_attempts, rows.complete_attempts).
    arrays = False

    @abstractmethod
    def leader_lock(self) -> LeaderLock:
        """The lock that makes one controller of this store the leader."""

    @abstractmethod
    def watch(self, wakeups: bool = True) -> Watcher:
        """A watcher of changes made by any process. ``wakeups=False``: one that only
        polls, where another watcher of this process takes the writers' wake-ups."""

    @abstractmethod
    def _changed(self, cur: Cursor, due: Sequence[str] = ()) -> None:
        """Tell watchers in other processes that jobs changed; ``due``: the tables whose
        queues got work due now, and nothing else (a watcher then wakes those pools' polls
        without a look at the store). Without it, watchers look at everything."""

    # --- dialect -------------------------------------------------------------------------

    @abstractmethod
    def _write(self) -> AbstractContextManager[Cursor]:
        """A write transaction that commits on success and rolls back on error; inside
        ``transaction()`` a savepoint of it (rolled back alone on error)."""

    def _joined(self) -> AbstractContextManager[Cursor]:
        """A write transaction, or inside ``transaction()`` part of it without a savepoint of
        its own, where the dialect's savepoints cost round trips (PostgreSQL): for writes
        whose statements are each atomic and leave consistent rows whatever comes after
        (a claim, a batch of results). Elsewhere ``_write()``."""
        return self._write()

    def transaction(self, key: str | None = None) -> AbstractContextManager[Cursor]:
        """One transaction for several calls of this thread (an agent's poll: its results,
        renewals and claims commit together, once). Each call inside keeps its own guarantees:
        its writes are a savepoint, undone alone if it raises.

        With ``key``, it runs alone among the transactions that name the same key: the key
        is held from the start, before any row is (inside another transaction: from there
        on). SQLite's write transactions run one at a time already; PostgreSQL takes the
        key's advisory lock."""
        return self._write()

    @abstractmethod
    def _cursor(self) -> AbstractContextManager[Cursor]:
        """A cursor for reads (autocommit)."""

    def _scan(self) -> AbstractContextManager[Cursor]:
        """A read that counts a long index range (/metrics' queue counts)."""
        return self._cursor()

    @abstractmethod
    def _lock(self, cur: Cursor, key: str) -> None:
        """Serialize transactions that share ``key`` (admission of one queue)."""

    def _lock_queue(self, cur: Cursor, table: str) -> None:
        """Serialize admission of ``table``'s queue, and prepare the claim's read."""
        self._lock(cur, f"claim:{table}")

    def _locked_reads(
        self, cur: Cursor, table: str, reads: Sequence[tuple[str, Sequence[Any]]]
    ) -> list[list[Any]]:
        """Serialize admission of ``table``'s queue (``_lock_queue``), then run ``reads``,
        each seeing every claim committed before the lock; the rows of each."""
        self._lock_queue(cur, table)
        rows = []
        for sql, params in reads:
            self._x(cur, sql, params)
            rows.append(cur.fetchall())
        return rows

    def _send_claim(
        self, table: str, sql: str, params: dict[str, Any], shared: bool = False
    ) -> Later[list[Any]]:
        """A claim made by one statement, ``sql`` (rows.CLAIM_PG), after the queue's
        admission lock (``shared``: shared with other claims while no wide job waits, for a
        queue without a concurrency cap): the rows it returns, as ``_send``'s. Only where
        ``arrays`` (PostgreSQL)."""
        raise NotImplementedError("claims in one statement are PostgreSQL's")

    @abstractmethod
    def close(self) -> None: ...

    def _sql(self, sql: str) -> str:
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    def _x(self, cur: Cursor, sql: str, params: Sequence[Any] = ()) -> Any:
        return cur.execute(self._sql(sql), tuple(params))

    def _send(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Later[list[Any]]:
        """``sql``'s rows, read when asked for (``Later``). Here it runs at once; PostgreSQL
        inside ``transaction()`` sends it with the statements around it."""
        with self._cursor() as cur:
            cur.execute(self._sql(sql), params if isinstance(params, dict) else tuple(params))
            return Later.ready(cur.fetchall())

    # --- migrations ------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply the migrations not applied yet; returns their versions."""
        applied: list[int] = []
        with self._write() as cur:
            self._lock(cur, "sp00ky-migrations")
            self._x(
                cur,
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                "version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
                "applied_at DOUBLE PRECISION NOT NULL)",
            )
            self._x(cur, "SELECT version FROM schema_migrations")
            done = {row[0] for row in cur.fetchall()}
            known = MIGRATIONS[-1].version
            if max(done, default=0) > known:
                # Migrated by a newer build: this one could misread or damage its rows (as a
                # build before migration 9 closes the wrong attempt's entry of a retried job).
                raise StoreError(
                    f"this store's schema is version {max(done)}, newer than this "
                    f"sp00ky-infra's ({known}): a newer sp00ky-infra migrated it; upgrade "
                    "this one rather than run the two on one store"
                )
            for migration in MIGRATIONS:
                if migration.version in done:
                    continue
                only = migration.sqlite if self.placeholder == "?" else migration.postgres
                for statement in (*migration.statements, *only):
                    self._x(cur, statement)
                self._x(
                    cur,
                    "INSERT INTO schema_migrations (version, description, applied_at) "
                    "VALUES (?, ?, 0)",
                    (migration.version, migration.description),
                )
                applied.append(migration.version)
        return applied

    def schema_version(self) -> int:
        with self._cursor() as cur:
            self._x(cur, "SELECT max(version) FROM schema_migrations")
            row = cur.fetchone()
        return int(row[0] or 0)
