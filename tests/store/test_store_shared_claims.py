"""PostgreSQL: claims of a queue without a concurrency cap share its admission lock while no
wide job (slots > 1) waits, and take it alone otherwise; under the shared lock a wide job is a
wall that no claim passes (rows.CLAIM_ANY_PG). Real connections, real locks."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from sp00ky_infra.store import NewJob, SqlStore, open_store
from sp00ky_infra.store.model import Job
from sp00ky_infra.store.rows import CLAIM_ANY_PG

TABLE = "render_job"
SHORT = 3.0  # seconds a claim that shares the lock may take; one that waits never returns


@pytest.fixture
def stores(postgres_url: str) -> Iterator[tuple[SqlStore, SqlStore]]:
    first, second = open_store(postgres_url), open_store(postgres_url, migrate=False)
    yield first, second
    first.close()
    second.close()


def _enqueue(
    store: SqlStore, count: int, now: float, slots: int = 1, priority: int = 0
) -> list[str]:
    """``count`` jobs, a millisecond apart: the list is in admission order."""
    return [
        store.enqueue(
            NewJob("renderer", TABLE, "/render", {"n": n}, slots=slots, priority=priority),
            now + n / 1000,
        ).id
        for n in range(count)
    ]


def _claim(store: SqlStore, free: int, machine: str) -> list[Job]:
    return store.claim(TABLE, free, "ctl", time.time(), lease=60, machine=machine)


class Held:
    """A claim (``claim``) inside a transaction of ``store`` that stays open, its lock held,
    until ``release``."""

    def __init__(self, store: SqlStore, claim: Callable[[], list[Job]]) -> None:
        self.claimed: list[Job] = []
        self._in, self._out = threading.Event(), threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(store, claim))
        self._thread.start()
        assert self._in.wait(10), "the first claim never got its lock"

    def _run(self, store: SqlStore, claim: Callable[[], list[Job]]) -> None:
        try:
            with store.transaction():
                self.claimed = claim()
                self._in.set()
                self._out.wait(30)
        except BaseException as exc:  # reported by release()
            self._error = exc
            self._in.set()

    def release(self) -> None:
        self._out.set()
        self._thread.join(30)
        if self._error is not None:
            raise self._error


def _in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(work()), daemon=True)
    thread.start()
    return thread, out


def test_claims_of_a_queue_of_narrow_jobs_run_side_by_side(
    stores: tuple[SqlStore, SqlStore],
) -> None:
    first, second = stores
    ids = _enqueue(first, 8, time.time() - 5)
    held = Held(first, lambda: _claim(first, 3, "m1"))
    try:
        thread, out = _in_thread(lambda: _claim(second, 3, "m2"))
        thread.join(SHORT)
        assert not thread.is_alive(), "the second claim waited for the first's transaction"
    finally:
        held.release()
    (taken,) = out
    # each took whole rows at the head that the other did not hold: together the first six
    assert {job.id for job in held.claimed} == set(ids[:3])
    assert {job.id for job in taken} == set(ids[3:6])
    assert {job.machine for job in taken} == {"m2"}
    assert {job.status for job in taken} == {"processing"}


def test_a_wide_job_waiting_makes_claims_take_the_lock_alone(
    stores: tuple[SqlStore, SqlStore],
) -> None:
    first, second = stores
    now = time.time() - 5
    narrow = _enqueue(first, 2, now - 1)
    wide = _enqueue(first, 1, now, slots=4)
    behind = _enqueue(first, 3, now + 1)
    held = Held(
        first, lambda: _claim(first, 2, "m1")
    )  # takes the two narrow jobs; the wide one is next
    try:
        thread, out = _in_thread(lambda: _claim(second, 3, "m2"))
        thread.join(SHORT)
        assert thread.is_alive(), "a claim shared the lock while a wide job waited"
    finally:
        held.release()
    thread.join(10)
    assert {job.id for job in held.claimed} == set(narrow)
    # after the first committed: the wide job is the head, needs 4 slots, m2 has 3: nothing
    # behind it passes it
    assert out == [[]]
    assert [job.id for job in _claim(second, 4, "m3")] == wide
    assert {job.id for job in _claim(second, 4, "m4")} == set(behind)


def test_a_wide_job_that_appears_under_the_shared_lock_is_a_wall(
    stores: tuple[SqlStore, SqlStore], postgres_url: str
) -> None:
    """The race the lock statement's check cannot see: a wide job committed after it chose
    the shared lock. The claim then takes only the rows ahead of the wide job, and leaves it
    unlocked for the claims that come next."""
    first, _ = stores
    now = time.time() - 5
    ahead = _enqueue(first, 2, now - 2)
    wide = _enqueue(first, 1, now - 1, slots=2)
    _enqueue(first, 3, now)
    with psycopg.connect(postgres_url, autocommit=True) as conn, conn.transaction():
        conn.execute(
            "SELECT pg_advisory_xact_lock_shared(hashtext(current_schema() || ':claim:' || %s)),"
            " set_config('sp00ky.claim_lock', 'shared', true)",
            (TABLE,),
        )
        params = {
            "table": TABLE, "now": time.time(), "free": 8, "owner": "ctl", "machine": "m1",
            "attempts": [f"a{n}" for n in range(8)], "lease": time.time() + 60,
        }  # fmt: skip
        rows = conn.execute(CLAIM_ANY_PG, params).fetchall()
        ids_taken = {row[1] for row in rows}
        with psycopg.connect(postgres_url, autocommit=True) as other:  # the test's schema too
            free = other.execute(
                "SELECT id FROM jobs WHERE id = %s FOR UPDATE SKIP LOCKED", (wide[0],)
            ).fetchall()
    assert ids_taken == set(ahead)
    assert free == [(wide[0],)], "the claim under the shared lock locked the wide job"
    # the next claim sees the wide job, takes the lock alone, and starts it first
    assert [job.id for job in _claim(first, 2, "m2")] == wide


def test_a_capped_queue_keeps_its_lock_alone(stores: tuple[SqlStore, SqlStore]) -> None:
    first, second = stores
    _enqueue(first, 6, time.time() - 5)

    def capped(store: SqlStore, machine: str) -> list[Job]:
        return store.claim(TABLE, 3, "ctl", time.time(), lease=60, machine=machine, concurrency=4)

    held = Held(first, lambda: capped(first, "m1"))
    try:
        thread, out = _in_thread(lambda: capped(second, "m2"))
        thread.join(SHORT)
        assert thread.is_alive(), "a capped queue's claims shared its lock"
    finally:
        held.release()
    thread.join(10)
    assert len(held.claimed) == 3 and len(out[0]) == 1  # 4 in flight at most
