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
from typing import Any, TypeVar

import psycopg
from psycopg.pq import TransactionStatus
from psycopg.types.numeric import Int4

from sp00ky_infra.store.dialect import Cursor, Later, LeaderLock, PerThread, Sql, Watcher
from sp00ky_infra.store.migrations import Migration
from sp00ky_infra.store.model import StoreError, StoreUnavailable
from sp00ky_infra.store.rows import (
    COMPLETE_ATTEMPT_PG,
    COMPLETE_ATTEMPTS_PG,
    RENEW_PG,
    Claim,
    Claimed,
)
from sp00ky_infra.store.sql import SqlStore
from sp00ky_infra.store.transitions import new_attempt_id

T = TypeVar("T")

LEADER_KEY = "sp00ky-controller-leader"
# The batched UPDATEs (jobs joined with unnested arrays) cost more to plan than to run, and a
# custom plan is made anew for each array size: generic plans, for the rest of the transaction.
GENERIC_PLANS = "SELECT set_config('plan_cache_mode', 'force_generic_plan', true)"
# A queue's admission lock, then the claim's settings: sorts off, so that stale statistics never
# trade the walk of jobs_queue (in admission order) for a sort of every pending row; generic
# plans (GENERIC_PLANS); no JIT, which sorts off would otherwise trigger for the claim's window.
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
# A new jobs table has no statistics until autovacuum's first pass over it, and a generic plan
# made meanwhile (a sequential scan a result) is kept until then: ``ensure_statistics`` runs
# that first ANALYZE from the tick once the table holds autovacuum's threshold of rows.
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
    name = "postgres"

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
    def write(self) -> Iterator[Sql]:
        with self._write() as cur:
            yield Sql(cur, self)

    @contextmanager
    def _write(self) -> Iterator[Cursor]:
        conn = self._connection()
        pipeline = self._pipeline()
        if pipeline is None:
            with conn.transaction(), conn.cursor() as cur:
                yield cur
            return
        with conn.cursor() as cur:  # inside transaction(): a savepoint of it
            self._execute(cur, "SAVEPOINT nested", ())
            try:
                yield cur
                self._execute(cur, "RELEASE SAVEPOINT nested", ())  # what it left unread, too
            except BaseException:
                _settle(pipeline)
                self._execute(cur, "ROLLBACK TO SAVEPOINT nested", ())
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
    def transaction(self, key: str | None = None) -> Iterator[Sql]:
        """In a pipeline, BEGIN and COMMIT sent as statements of it (psycopg's own
        transaction blocks sync the pipeline as they open and twice as they close): the
        BEGIN and the generic plans' setting (GENERIC_PLANS, for the batched statements) go
        with the first statements, and what ``send`` sends travels with the statements
        around it: a poll's first reads and its results in one round trip, its renewals and
        its claim with the COMMIT in another. A statement run with ``Sql.execute`` is synced
        at once (its rows and rowcount then, as outside a pipeline). ``key``'s advisory lock
        goes in the plans' statement (GENERIC_PLANS_KEYED): no round trip of its own."""
        conn = self._connection()
        if self._in_transaction(conn):  # inside another: a savepoint of it
            with self._write() as cur:
                if key is not None:
                    cur.execute(f"SELECT {_KEYED}", (_key_number(key),))
                yield Sql(cur, self)
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
                    yield Sql(cur, self)
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

    def _native(self, sql: str) -> str:
        return sql.replace("?", "%s")

    def _execute(self, cur: Cursor, sql: str, params: Sequence[Any]) -> None:
        cur.execute(self._native(sql), tuple(params))
        pipeline = self._pipeline()
        if pipeline is not None:
            pipeline.sync()

    def send(self, sql: str, params: Sequence[Any] = ()) -> Later[list[Any]]:
        return self._send(self._native(sql), tuple(params))

    def _send(self, statement: str, params: tuple[Any, ...] | dict[str, Any]) -> Later[list[Any]]:
        """``send`` of a statement in psycopg's own placeholders (named ones too)."""
        if self._pipeline() is None:
            with self._connection().cursor() as cur:
                cur.execute(statement, params)
                return Later.ready(cur.fetchall())
        cur = self._connection().cursor()
        cur.execute(statement, params)

        def rows() -> list[Any]:
            with cur:
                return cur.fetchall()

        return Later(rows)

    @contextmanager
    def joined(self) -> Iterator[Sql]:
        with self._joined() as cur:
            yield Sql(cur, self)

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
    def read(self) -> Iterator[Sql]:
        with self._connection().cursor() as cur:
            yield Sql(cur, self)

    @contextmanager
    def scan(self) -> Iterator[Sql]:
        # The parallel workers the planner asks for to count a long index range cost more to
        # start than they save on a small machine.
        conn = self._connection()
        with conn.transaction(), conn.cursor() as cur:
            cur.execute("SET LOCAL max_parallel_workers_per_gather = 0")
            yield Sql(cur, self)

    def _lock(self, cur: Cursor, key: str) -> None:
        # The key as _KEY's (the store's Cursor takes parameters by position).
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(current_schema() || ':' || %s))", (key,))

    def _own_statements(self, migration: Migration) -> tuple[str, ...]:
        return migration.postgres

    def indexed(self, table: str, index: str) -> str:
        return table

    def join_each(self, outer: str, table: str, on: str, where: str, index: str) -> str:
        # A lateral subquery, answered with a range of the index a row of ``outer``, where a
        # join would rather hash ``outer`` and read every row of ``table`` (OFFSET 0: the
        # subquery is not pulled up into a join).
        alias = table.split()[-1]
        return (
            f"FROM {outer} CROSS JOIN LATERAL (SELECT * FROM {table} "
            f"WHERE {on} AND {where} OFFSET 0) AS {alias}"
        )

    def each_queue(
        self, head: str, queues: Sequence[tuple[int, str, int]], now: float
    ) -> tuple[str, list[Any]]:
        # The queues as VALUES: one statement to plan, not one a queue.
        rows = ", ".join(f"({n}, ?, ?)" for n, _, _ in queues)
        sql = (
            f"WITH q (n, tbl, cap) AS (VALUES {rows}) SELECT q.n, "
            + head.format(tbl="q.tbl", now="?", cap="q.cap")
            + " FROM q"
        )
        return sql, [*(value for _, table, cap in queues for value in (table, cap)), now]

    def claim_head(self, claim: Claim, shape: Claimed[T]) -> Later[list[T]]:
        """Admission and the attempts' start in one statement (rows.CLAIM_PG): one round trip
        after the queue's admission lock, not a read, admission in Python and a write with
        the lock held across the three."""
        params = {
            "table": claim.table,
            "now": claim.now,
            "free": claim.free_slots,
            "concurrency": claim.concurrency,
            "owner": claim.owner,
            "machine": claim.machine,
            "attempts": [new_attempt_id() for _ in range(claim.free_slots)],
            "lease": claim.now + claim.lease,
        }
        if claim.concurrency is None:  # claims of the queue run side by side (rows.CLAIM_ANY_PG)
            claimed = self._send_claim(claim.table, shape.any_pg, params, shared=True)
        else:
            claimed = self._send_claim(claim.table, shape.capped_pg, params)
        read = shape.read
        return claimed.then(
            lambda rows: [read(row[1:]) for row in sorted(rows, key=lambda r: int(r[0]))]
        )

    def _send_claim(
        self, table: str, sql: str, params: dict[str, Any], shared: bool = False
    ) -> Later[list[Any]]:
        """The queue's admission lock (``shared``: shared with other claims while no wide job
        waits, for a queue without a concurrency cap), then the claim, whose snapshot is
        taken after the lock, as its own statement's always is: sent together (inside
        transaction() with what is sent around them; alone, with the BEGIN and COMMIT of a
        claim made alone, one round trip)."""
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

    def renew_leases(
        self, leases: Sequence[tuple[str, str]], now: float, lease: float
    ) -> Later[set[str]]:
        # One statement: one round trip, one run of the jobs triggers.
        ids, attempts = [job for job, _ in leases], [attempt for _, attempt in leases]
        rows = self.send(RENEW_PG, (now + lease, now, ids, attempts, ["processing"] * len(ids)))
        return rows.then(lambda rows: {row[0] for row in rows})

    def end_attempts(
        self, results: Sequence[tuple[str, str, str | None]], now: float, machine: str | None
    ) -> Later[dict[str, float | None]]:
        """One statement, which needs no transaction of its own: inside transaction() it is
        part of it."""
        if len(results) > 1:
            rows = self.send(
                COMPLETE_ATTEMPTS_PG,
                (now, now, [each[0] for each in results], [each[1] for each in results],
                 [each[2] for each in results], ["processing"] * len(results), machine,
                 machine),
            )  # fmt: skip
        else:
            ((job_id, attempt, payload),) = results
            rows = self.send(
                COMPLETE_ATTEMPT_PG, (payload, now, now, job_id, attempt, machine, machine)
            ).then(lambda found: [(job_id, row[0]) for row in found])
        return rows.then(lambda rows: {row[0]: row[1] for row in rows})

    def ensure_statistics(self) -> bool:
        if self._analyzed:
            return False
        with self.read() as sql:
            never, rows, threshold = sql.execute(NEVER_ANALYZED).fetchone() or (False, 0, 0)
        if not never:
            self._analyzed = True  # analyzed once (by anyone): autovacuum keeps it up
            return False
        if rows < threshold:
            return False
        try:
            with self.joined() as sql:
                sql.execute(ANALYZE_LOCK_TIMEOUT)
                sql.execute("ANALYZE jobs")
        except psycopg.errors.LockNotAvailable:
            return False  # autovacuum is analyzing it: the next tick sees its statistics
        self._analyzed = True
        return True

    def leader_lock(self) -> LeaderLock:
        return AdvisoryLock(self.url)

    def watch(self, wakeups: bool = True) -> Watcher:
        return NotifyWatcher(self.url)  # a NOTIFY reaches every listener: nothing to share

    def _changed(self, cur: Cursor, due: Sequence[str]) -> None:
        cur.execute(f"SELECT pg_notify('{CHANNEL}_' || current_schema(), '')")

    def close(self) -> None:
        self._connections.close_all()

    def __repr__(self) -> str:
        return f"PostgresStore({redact(self.url)!r})"
