"""The PostgreSQL dialect (psycopg 3; one autocommit connection per thread).

Write transactions are explicit; a queue's admission is serialized by a transaction-scoped
advisory lock (so the head of a queue is never overtaken), and rows are read with
``FOR UPDATE SKIP LOCKED`` so that a claim never waits on a row another writer holds.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import threading
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.numeric import Int4

from sp00ky_infra.store.dialect import Cursor, Later, LeaderLock, PerThread, Watcher
from sp00ky_infra.store.model import StoreError, StoreUnavailable
from sp00ky_infra.store.sql import SqlStore

LEADER_KEY = "sp00ky-controller-leader"
# The batched UPDATEs (a join of jobs with arrays unnested) cost 0.2-0.3 ms to plan, more than
# they take to run; PostgreSQL kept planning them anew at each execution (its custom plans for
# the array's size), 250-860 us a batch against 100-250 us with the prepared statement's
# generic plan. Set for the rest of the transaction (a poll's).
GENERIC_PLANS = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"
# A queue's admission lock, then the claim reads the head of the queue through jobs_queue,
# already in admission order. With stale statistics (a table analyzed while nearly empty,
# then filled by a burst) the planner expects one row and sorts every pending row instead:
# 25 ms a claim at 10,000 pending. Turning sorts off for this transaction only keeps the
# index walk. And generic plans for the attempts' UPDATE that follows (GENERIC_PLANS). And no
# JIT: the claim's window sorts its 16 rows, which with sorts off costs 1e10 to the planner,
# far past jit_above_cost, and compiling it took 370 ms a claim.
# A lock's key: scoped by schema so that stores in different schemas of one database never
# contend.
_KEY = "hashtext(current_schema() || ':' || %(key)s)"
_CLAIM_SETTINGS = (
    "set_config('enable_sort', 'off', true), set_config('jit', 'off', true), "
    "set_config('plan_cache_mode', 'force_generic_plan', true)"
)
LOCK_QUEUE = f"SELECT pg_advisory_xact_lock({_KEY}), {_CLAIM_SETTINGS}"
# A transaction that names a key (``transaction(key=...)``): its lock, taken in the statement
# that sets the generic plans, before the transaction touches any row. In the two-number key
# space (the schema's, the key's: ``_key_number``), apart from every one-number lock above
# and the leader's: a key is a machine's name, which any request may send, and none can
# then land on the leader's lock, held for good, and wait for ever. The number is made here,
# so the statement has no text parameter to refuse (a NUL) before it is sent.
_KEYED = "pg_advisory_xact_lock(hashtext(current_schema()), %s)"
GENERIC_PLANS_KEYED = f"{GENERIC_PLANS}, {_KEYED}"
# For a queue without a concurrency cap: its admission lock shared while it has no wide job
# (slots > 1) pending, alone otherwise (rows.CLAIM_ANY_PG says why that is safe); which one,
# kept for the claim that follows in the transaction (``sp00ky.claim_lock``). The check reads
# the snapshot before the lock: the claim's own, taken after, looks again (the wall).
LOCK_QUEUE_SHARED = (
    "SELECT set_config('sp00ky.claim_lock', CASE WHEN EXISTS (SELECT 1 FROM jobs "
    "WHERE tbl = %(table)s AND status = 'pending' AND slots > 1) "
    f"THEN (SELECT 'exclusive' FROM pg_advisory_xact_lock({_KEY})) "
    f"ELSE (SELECT 'shared' FROM pg_advisory_xact_lock_shared({_KEY})) END, true), "
    f"{_CLAIM_SETTINGS}"
)
CHANNEL = "sp00ky_jobs"
# A new jobs table has no statistics until autovacuum's first pass over it, up to
# autovacuum_naptime (a minute) after its first rows. Meanwhile the planner guesses, and a
# generic plan it makes then is kept until the table is analyzed: on a new table of 2,000 rows
# the batched results' UPDATE read every row for each result (a nested loop over a sequential
# scan of jobs), 9-16 ms for 16 results against 0.3-0.5 ms by id once analyzed (and their
# transaction, its commit included, 13-16 ms against 1.4).
# ``ensure_statistics`` runs that first ANALYZE from the tick as soon as the table holds as
# many rows as autovacuum's own threshold; a table analyzed once is left to autovacuum.
NEVER_ANALYZED = (
    "SELECT last_analyze IS NULL AND last_autoanalyze IS NULL, "
    "(SELECT count(*) FROM (SELECT 1 FROM jobs "
    "LIMIT current_setting('autovacuum_analyze_threshold')::int) AS head), "
    "current_setting('autovacuum_analyze_threshold')::int "
    "FROM pg_stat_user_tables WHERE relid = 'jobs'::regclass"
)
# ANALYZE waits for a lock autovacuum's ANALYZE of the table holds: never the tick for long
# (that one gives the table its statistics anyway).
ANALYZE_LOCK_TIMEOUT = "SELECT set_config('lock_timeout', '100ms', true)"


class NotifyWatcher(Watcher):
    """LISTENs on the schema's channel; writers NOTIFY in their transactions."""

    def __init__(self, url: str) -> None:
        self._conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
        schema = self._conn.execute("SELECT current_schema()").fetchone()
        channel = f"{CHANNEL}_{schema[0] if schema else 'public'}"
        self._conn.execute(f'LISTEN "{channel}"')

    def wait(self, timeout: float) -> bool:
        return any(True for _ in self._conn.notifies(timeout=timeout, stop_after=1))

    def close(self) -> None:
        self._conn.close()


class AdvisoryLock(LeaderLock):
    """A session-level advisory lock on a connection of its own: the server frees it when the
    holder's connection ends, which a killed process's does at once."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._conn: psycopg.Connection | None = None

    def try_acquire(self) -> bool:
        if self._conn is not None:
            try:
                self._conn.execute("SELECT 1")
                return True
            except psycopg.Error:
                self.release()  # the connection died, and the lock with it
        conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
        row = conn.execute(
            "SELECT pg_try_advisory_lock(hashtext(current_schema() || ':' || %s))", (LEADER_KEY,)
        ).fetchone()
        if row is None or not row[0]:
            conn.close()
            return False
        self._conn = conn
        return True

    def release(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


@contextmanager
def scratch_schema(url: str, prefix: str = "scratch") -> Iterator[str]:
    """``url`` with a schema of its own (tables made there), dropped afterwards: for the
    tests and benchmarks that share one database."""
    schema = f"{prefix}_{secrets.token_hex(6)}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    separator = "&" if "?" in url else "?"
    try:
        yield f"{url}{separator}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def redact(url: str) -> str:
    """The URL without its password, for messages."""
    return re.sub(r"//([^:/@]+):[^@/]*@", r"//\1:***@", url)


def _key_number(key: str) -> Int4:
    """``key`` as the second number of its advisory lock (two keys that share one only take
    turns)."""
    number = zlib.crc32(key.encode("utf-8", "backslashreplace"))
    return Int4(number - (1 << 32) if number >= 1 << 31 else number)


def _settle(pipeline: psycopg.Pipeline) -> None:
    """After an error in a pipeline: its aborted statements collected (their errors are the
    one already raised), so that the next statement runs."""
    with contextlib.suppress(psycopg.Error):
        pipeline.sync()


class PostgresStore(SqlStore):
    placeholder = "%s"
    arrays = True

    def __init__(self, url: str) -> None:
        self.url = url
        self._connections: PerThread[psycopg.Connection] = PerThread(
            self._connect, usable=lambda conn: not conn.closed
        )
        self._pipelines = threading.local()  # this thread's transaction(), in a pipeline
        self._analyzed = False  # the jobs table has had statistics: ensure_statistics is done

    def _connect(self) -> psycopg.Connection:
        try:
            return psycopg.connect(self.url, autocommit=True, connect_timeout=10)
        except psycopg.Error as exc:
            raise StoreUnavailable(
                f"cannot connect to PostgreSQL at {redact(self.url)}: {exc}".strip()
            ) from exc

    def _connection(self) -> psycopg.Connection:
        return self._connections.get()

    @contextmanager
    def _write(self) -> Iterator[Cursor]:
        conn = self._connection()
        pipeline = self._pipeline()
        if pipeline is None:
            with conn.transaction(), conn.cursor() as cur:
                yield cur
            return
        with conn.cursor() as cur:  # inside transaction(): a savepoint of it
            self._x(cur, "SAVEPOINT nested")
            try:
                yield cur
                self._x(cur, "RELEASE SAVEPOINT nested")  # what the block left unread, too
            except BaseException:
                _settle(pipeline)
                self._x(cur, "ROLLBACK TO SAVEPOINT nested")
                raise

    def _pipeline(self) -> psycopg.Pipeline | None:
        """This thread's ``transaction()`` pipeline, while one is open."""
        return getattr(self._pipelines, "current", None)

    def _in_transaction(self, conn: psycopg.Connection) -> bool:
        return (
            self._pipeline() is not None
            or conn.info.transaction_status == TransactionStatus.INTRANS
        )

    @contextmanager
    def transaction(self, key: str | None = None) -> Iterator[Cursor]:
        """In a pipeline, BEGIN and COMMIT sent as statements of it (psycopg's own
        transaction blocks sync the pipeline as they open and twice as they close): the
        BEGIN and the generic plans' setting (GENERIC_PLANS, for the batched statements) go
        with the first statements, and what ``_send`` sends travels with the statements
        around it: a poll's first reads and its results in one round trip, its renewals and
        its claim with the COMMIT in another. A statement run with ``_x`` is synced at once
        (its rows and rowcount then, as outside a pipeline). ``key``'s advisory lock goes
        in the plans' statement (GENERIC_PLANS_KEYED): no round trip of its own."""
        conn = self._connection()
        if self._in_transaction(conn):  # inside another: a savepoint of it
            with self._write() as cur:
                if key is not None:
                    cur.execute(f"SELECT {_KEYED}", (_key_number(key),))
                yield cur
            return
        try:
            with conn.pipeline() as pipeline, conn.cursor() as cur:
                cur.execute("BEGIN")
                try:
                    if key is None:
                        cur.execute(GENERIC_PLANS)
                    else:
                        cur.execute(GENERIC_PLANS_KEYED, (_key_number(key),))
                    self._pipelines.current = pipeline
                    yield cur
                except BaseException:
                    self._pipelines.current = None
                    _settle(pipeline)
                    if not conn.closed and conn.info.transaction_status != TransactionStatus.IDLE:
                        cur.execute("ROLLBACK")  # sent as the pipeline ends
                    raise
                self._pipelines.current = None
                cur.execute("COMMIT")  # sent, with what is still queued, as the pipeline ends
        except psycopg.Error:
            # A statement still queued failed as the pipeline ended: the COMMIT after it did
            # not run, and the transaction is open, aborted (or, had the BEGIN gone alone,
            # open): never left so for the connection's next user.
            if not conn.closed and conn.info.transaction_status in (
                TransactionStatus.INERROR,
                TransactionStatus.INTRANS,
            ):
                conn.execute("ROLLBACK")
            raise
        if cur.statusmessage != "COMMIT":
            # A statement of the block failed and the block went on (its error caught): the
            # server answered the COMMIT with a ROLLBACK. Nothing of it was written.
            raise StoreError(f"the transaction was rolled back ({cur.statusmessage})")

    def _x(self, cur: Cursor, sql: str, params: Sequence[Any] = ()) -> Any:
        result = cur.execute(self._sql(sql), tuple(params))
        pipeline = self._pipeline()
        if pipeline is not None:
            pipeline.sync()
        return result

    def _send(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Later[list[Any]]:
        if self._pipeline() is None:
            return super()._send(sql, params)
        cur = self._connection().cursor()
        cur.execute(self._sql(sql), params if isinstance(params, dict) else tuple(params))

        def rows() -> list[Any]:
            with cur:
                return cur.fetchall()

        return Later(rows)

    @contextmanager
    def _joined(self) -> Iterator[Cursor]:
        conn = self._connection()
        if self._in_transaction(conn):
            with conn.cursor() as cur:  # inside transaction(): a SAVEPOINT would cost 2 trips
                yield cur
        else:
            with conn.transaction(), conn.cursor() as cur:
                yield cur

    @contextmanager
    def _cursor(self) -> Iterator[Cursor]:
        with self._connection().cursor() as cur:
            yield cur

    @contextmanager
    def _scan(self) -> Iterator[Cursor]:
        # Counting 100,000 entries of an index: the two parallel workers the planner asks for
        # cost more to start than they save on two cores (measured 25 ms with, 15 ms without).
        conn = self._connection()
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SET LOCAL max_parallel_workers_per_gather = 0")
            yield cur

    def _lock(self, cur: Cursor, key: str) -> None:
        # The key as _KEY's (the store's Cursor takes parameters by position).
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':' || %s))", (key,))

    def _send_claim(
        self, table: str, sql: str, params: dict[str, Any], shared: bool = False
    ) -> Later[list[Any]]:
        # The queue's admission lock, then the claim (rows.CLAIM_PG), the claim's snapshot
        # taken after the lock, as its own statement's always is: sent together (inside
        # transaction() with what is sent around them; alone, with the BEGIN and COMMIT of a
        # claim made alone, one round trip).
        key = f"claim:{table}"
        lock = (
            (LOCK_QUEUE_SHARED, {"table": table, "key": key})
            if shared
            else (LOCK_QUEUE, {"key": key})
        )
        if self._pipeline() is not None:
            self._send(*lock)
            return self._send(sql, params)
        conn = self._connection()
        with conn.pipeline(), self._joined() as cur, conn.cursor() as locking:
            locking.execute(*lock)
            cur.execute(sql, params)
            return Later.ready(cur.fetchall())

    def ensure_statistics(self) -> bool:
        if self._analyzed:
            return False
        with self._cursor() as cur:
            cur.execute(NEVER_ANALYZED)
            never, rows, threshold = cur.fetchone() or (False, 0, 0)
        if not never:
            self._analyzed = True  # analyzed once (by anyone): autovacuum keeps it up
            return False
        if rows < threshold:
            return False
        try:
            with self._joined() as cur:
                cur.execute(ANALYZE_LOCK_TIMEOUT)
                cur.execute("ANALYZE jobs")
        except psycopg.errors.LockNotAvailable:
            return False  # autovacuum is analyzing it: the next tick sees its statistics
        self._analyzed = True
        return True

    def leader_lock(self) -> LeaderLock:
        return AdvisoryLock(self.url)

    def watch(self, wakeups: bool = True) -> Watcher:
        return NotifyWatcher(self.url)  # a NOTIFY reaches every listener: nothing to share

    def _changed(self, cur: Cursor, due: Sequence[str] = ()) -> None:
        cur.execute(f"SELECT pg_notify('{CHANNEL}_' || current_schema(), '')")

    def close(self) -> None:
        self._connections.close_all()

    def __repr__(self) -> str:
        return f"PostgresStore({redact(self.url)!r})"
