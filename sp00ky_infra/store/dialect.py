"""The dialect core: connections, transactions, locking and migrations of a SQL store.

The tables (``jobs.py``, ``sweep.py``, ``retention.py``, ``machines.py``, ``schedules.py``,
``tick.py``) write their SQL once against this core, through ``Sql``; the dialects
(``sqlite.py``, ``postgres.py``) implement it, and the few statements they write apart.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from sp00ky_infra.store.migrations import MIGRATIONS, Migration
from sp00ky_infra.store.model import StoreError
from sp00ky_infra.store.rows import Claim, Claimed


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
    def executemany(self, sql: str, params: Iterable[Sequence[Any]], /) -> Any: ...


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


class Sql:
    """A cursor of the store's, in a read or a write transaction: statements written once with
    ``?`` placeholders, run as the dialect runs them. What the tables use of the core."""

    __slots__ = ("_cur", "_dialect")

    def __init__(self, cur: Cursor, dialect: Dialect) -> None:
        self._cur = cur
        self._dialect = dialect

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Sql:
        self._dialect._execute(self._cur, sql, params)
        return self

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self._cur.executemany(self._dialect._native(sql), rows)

    def fetchone(self) -> Any:
        return self._cur.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cur.fetchall()

    def lock(self, key: str) -> None:
        """Serialize the transactions that take ``key``, until this one ends."""
        self._dialect._lock(self._cur, key)

    def changed(self, due: Sequence[str] = ()) -> None:
        """Tell watchers in other processes that jobs changed; ``due``: the tables whose
        queues got work due now, and nothing else (a watcher then wakes those pools' polls
        without a look at the store). Without it, watchers look at everything."""
        self._dialect._changed(self._cur, due)


class Dialect(ABC):
    """A SQL database on per-thread connections: its transactions, reads and locks (``Sql``),
    and the statements each dialect writes its own way. Subclasses supply the dialect; the
    underscored hooks are what ``Sql`` runs its statements, locks and wake-ups through."""

    name: ClassVar[str]

    @abstractmethod
    def leader_lock(self) -> LeaderLock:
        """The lock that makes one controller of this store the leader."""

    @abstractmethod
    def watch(self, wakeups: bool = True) -> Watcher:
        """A watcher of changes made by any process. ``wakeups=False``: one that only
        polls, where another watcher of this process takes the writers' wake-ups."""

    @abstractmethod
    def close(self) -> None: ...

    # --- transactions and reads ------------------------------------------------------------

    @abstractmethod
    def write(self) -> AbstractContextManager[Sql]:
        """A write transaction that commits on success and rolls back on error; inside
        ``transaction()`` a savepoint of it (rolled back alone on error)."""

    def joined(self) -> AbstractContextManager[Sql]:
        """A write transaction, or inside ``transaction()`` part of it without a savepoint of
        its own, where the dialect's savepoints cost round trips (PostgreSQL): for writes
        whose statements are each atomic and leave consistent rows whatever comes after
        (a claim, a batch of results). Elsewhere ``write()``."""
        return self.write()

    def transaction(self, key: str | None = None) -> AbstractContextManager[Sql]:
        """One transaction for several calls of this thread (an agent's poll: its results,
        renewals and claims commit together, once). Each call inside keeps its own guarantees:
        its writes are a savepoint, undone alone if it raises.

        With ``key``, it runs alone among the transactions that name the same key: the key
        is held from the start, before any row is (inside another transaction: from there
        on). SQLite's write transactions run one at a time already; PostgreSQL takes the
        key's advisory lock."""
        return self.write()

    @abstractmethod
    def read(self) -> AbstractContextManager[Sql]:
        """A cursor for reads, and for writes of one statement (autocommit)."""

    def scan(self) -> AbstractContextManager[Sql]:
        """A read that counts a long index range (/metrics' queue counts)."""
        return self.read()

    def send(self, sql: str, params: Sequence[Any] = ()) -> Later[list[Any]]:
        """``sql``'s rows, read when asked for (``Later``). Here it runs at once; PostgreSQL
        inside ``transaction()`` sends it with the statements around it."""
        with self.read() as cur:
            return Later.ready(cur.execute(sql, params).fetchall())

    # --- what each dialect does its own way --------------------------------------------------

    def _native(self, sql: str) -> str:
        """``sql`` with the dialect's placeholders for ``?``."""
        return sql

    def _execute(self, cur: Cursor, sql: str, params: Sequence[Any]) -> None:
        cur.execute(self._native(sql), tuple(params))

    @abstractmethod
    def _lock(self, cur: Cursor, key: str) -> None:
        """Serialize transactions that share ``key`` (admission of one queue)."""

    @abstractmethod
    def _changed(self, cur: Cursor, due: Sequence[str]) -> None:
        """``Sql.changed``."""

    @abstractmethod
    def _own_statements(self, migration: Migration) -> tuple[str, ...]:
        """The statements of ``migration`` for this dialect alone (its triggers)."""

    @abstractmethod
    def claim_head(self, claim: Claim, shape: Claimed[T]) -> Later[list[T]]:
        """Start the attempts of the head of ``claim.table``'s queue that fit
        (``JobTable.claim``); each read as ``shape`` has it."""

    @abstractmethod
    def renew_leases(
        self, leases: Sequence[tuple[str, str]], now: float, lease: float
    ) -> Later[set[str]]:
        """Extend the leases of (job id, attempt) pairs still current; their job ids."""

    @abstractmethod
    def end_attempts(
        self, results: Sequence[tuple[str, str, str | None]], now: float, machine: str | None
    ) -> Later[dict[str, float | None]]:
        """End in success the current attempts of running jobs nobody killed, given as (job
        id, attempt, result's JSON), one a job (``JobTable.complete_many``'s common case);
        the started_at of those it ended."""

    @abstractmethod
    def indexed(self, table: str, index: str) -> str:
        """``table`` (a name and an alias) as a FROM names it to be read through ``index``,
        where the dialect is told which index (SQLite, without statistics to choose by)."""

    @abstractmethod
    def join_each(self, outer: str, table: str, on: str, where: str, index: str) -> str:
        """``FROM outer`` joined with the rows of ``table`` (a name and an alias) that match
        each of its rows (``on``) and hold ``where``, each row's a range of ``index``."""

    @abstractmethod
    def each_queue(
        self, head: str, queues: Sequence[tuple[int, str, int]], now: float
    ) -> tuple[str, list[Any]]:
        """One statement answering (n, ``head``) for each queue (n, table, cap), and its
        parameters: ``head`` a scalar subquery of ``{tbl}``, ``{now}`` and ``{cap}``."""

    # --- migrations ------------------------------------------------------------------------

    def migrate(self) -> list[int]:
        """Apply the migrations not applied yet; returns their versions."""
        applied: list[int] = []
        with self.write() as sql:
            sql.lock("sp00ky-migrations")
            sql.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                "version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
                "applied_at DOUBLE PRECISION NOT NULL)",
            )
            done = {
                row[0] for row in sql.execute("SELECT version FROM schema_migrations").fetchall()
            }
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
                for statement in (*migration.statements, *self._own_statements(migration)):
                    sql.execute(statement)
                sql.execute(
                    "INSERT INTO schema_migrations (version, description, applied_at) "
                    "VALUES (?, ?, 0)",
                    (migration.version, migration.description),
                )
                applied.append(migration.version)
        return applied

    def schema_version(self) -> int:
        with self.read() as sql:
            row = sql.execute("SELECT max(version) FROM schema_migrations").fetchone()
        return int(row[0] or 0)
