"""Where the store puts job rows and how much it writes for them: rows that are claimed
together lie together (a claim and its results change a few pages, not a page a job), on
both dialects."""

from __future__ import annotations

import multiprocessing
import re
import threading
import time
from pathlib import Path

import psycopg
import pytest

from sp00ky_infra.policy.jobs import Queued, admit
from sp00ky_infra.store import SqlStore, open_store
from sp00ky_infra.store.postgres import GENERIC_PLANS
from sp00ky_infra.store.rows import COMPLETE_ATTEMPTS_PG
from sp00ky_infra.store.sqlite import WriterQueue, _Waiter
from tests.controllers import wait_for
from tests.store.test_store_contract import LEASE, T0, new


def physical_order(store: SqlStore) -> list[str]:
    """The jobs' ids in the order the database laid the rows down (SQLite's rowid,
    PostgreSQL's tuple id, which for rows never updated is the order they were written)."""
    order = "ctid" if store.name == "postgres" else "rowid"
    with store.read() as cur:
        cur.execute(f"SELECT id FROM jobs ORDER BY {order}")
        return [row[0] for row in cur.fetchall()]


def test_a_fan_out_is_written_in_admission_order(store: SqlStore) -> None:
    # Rows of one enqueue_many share created_at; their random ids decide their admission
    # order, and the priorities come first.
    priorities = [0, 5, 0, 0, 5, 1, 0, 0, 1, 0] * 3
    ids = store.enqueue_many(
        [new(priority=p, payload={"n": n}) for n, p in enumerate(priorities)], T0
    )
    queued = [job.id for job in store.queue("render_job", T0, limit=100)]
    assert sorted(queued) == sorted(ids) and ids != queued  # returned in the order given
    assert physical_order(store) == queued


def generic_plan(url: str, sql: str) -> str:
    """The generic plan PostgreSQL makes for the store's statement ``sql`` as a poll's
    transaction runs it (prepared, GENERIC_PLANS set), on its own connection. An EXPLAIN of
    the statement with its parameters bound is planned for those values instead."""
    numbered = iter(range(1, 100))
    prepared = re.sub(r"%[sb]", lambda _: f"${next(numbered)}", sql)
    unbound = ", ".join(["NULL"] * (next(numbered) - 1))
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute(GENERIC_PLANS)
        conn.execute(f"PREPARE statement AS {prepared}")
        rows = conn.execute(f"EXPLAIN EXECUTE statement({unbound})").fetchall()
    return "\n".join(row[0] for row in rows)


def test_batched_results_find_their_rows_by_id_on_a_table_never_analyzed(
    postgres_url: str,
) -> None:
    # A burst of enqueues leaves the table without statistics: a batch of results must
    # still look its rows up by id, not read every running job through a partial index on
    # status that the planner believes nearly empty.
    store = open_store(postgres_url)
    try:
        store.enqueue_many([new(payload={"n": n}) for n in range(3000)], T0)
        store.claim("render_job", 16, "controller-1", T0, LEASE, machine="m1")
    finally:
        store.close()
    plan = generic_plan(postgres_url, COMPLETE_ATTEMPTS_PG)
    # by id (or, on so small a table, one pass), never a status index
    assert not re.search(r"jobs_(queue|pending_due|running|lease|deadline)", plan), plan


@pytest.mark.parametrize(
    ("slots", "free", "running", "concurrency"),
    [
        ([1, 1, 1, 1], 3, 0, None),
        ([1, 2, 1, 1], 2, 0, None),  # the 2-slot job waits, and the one behind it
        ([3, 1, 1], 2, 0, None),  # the head does not fit: nothing starts
        ([1, 1, 2, 1, 1], 8, 0, None),
        ([1, 1, 1, 1, 1], 8, 2, 4),  # two running of four allowed: two start
        ([1, 1, 1], 8, 3, 3),  # none left under the cap
        ([2, 1, 1], 3, 1, 3),
    ],
)
def test_a_claim_admits_what_policy_admit_does(
    store: SqlStore, slots: list[int], free: int, running: int, concurrency: int | None
) -> None:
    # The claim's admission (in SQL on PostgreSQL, by policy.jobs.admit on SQLite) against
    # admit itself, over the same queue: priorities, ages and slots mixed.
    for n in range(running):
        store.enqueue(new(payload={"running": n}, priority=10), T0 - 100)
    if running:
        store.claim("render_job", running, "controller-1", T0 - 100, LEASE, machine="m0")
    for n, need in enumerate(slots):
        store.enqueue(new(payload={"n": n}, slots=need, priority=n % 2), T0 + n % 3)
    queue = store.queue("render_job", T0 + 10)
    expected = admit([Queued(job.id, job.slots) for job in queue], free, running, concurrency)
    claimed = store.claim(
        "render_job", free, "controller-1", T0 + 10, LEASE, machine="m1", concurrency=concurrency
    )
    assert [job.id for job in claimed] == expected
    for job in claimed:
        assert job.status == "processing" and job.machine == "m1"
        assert job.attempts[-1]["id"] == job.attempt and job.attempts[-1]["started_at"] == T0 + 10
        assert store.get(job.id) == job
    assert len({job.attempt for job in claimed}) == len(claimed)


def _queues(tmp_path: Path, count: int) -> list[WriterQueue]:
    """``count`` queues of one database, each with a descriptor of its own: they lock apart
    as the queues of different processes do."""
    return [WriterQueue(f"{tmp_path}/state.db.writers") for _ in range(count)]


def _acquire_in_thread(queue: WriterQueue, timeout: float) -> tuple[threading.Thread, list[bool]]:
    answer: list[bool] = []
    waiting = threading.Thread(target=lambda: answer.append(queue.acquire(timeout)))
    waiting.start()
    return waiting, answer


def _waits_in_flock(queue: WriterQueue) -> bool:
    waiter = queue._waiter
    return waiter is not None and waiter._blocked


def test_writers_of_other_processes_queue_on_a_file_beside_the_database(tmp_path: Path) -> None:
    # The second waits for the first, gives up at its timeout (SQLite's own lock then
    # decides), and takes the lock as soon as the first lets go.
    first, second = _queues(tmp_path, 2)
    assert first.acquire(1.0)
    started = time.monotonic()
    assert not second.acquire(0.02)
    assert 0.02 <= time.monotonic() - started < 1.0
    first.release()
    assert second.acquire(0.5)
    second.release()


def test_a_waiting_writer_is_handed_the_lock_and_holds_it_alone(tmp_path: Path) -> None:
    first, second, third = _queues(tmp_path, 3)
    assert first.acquire(1.0)
    waiting, answer = _acquire_in_thread(second, 10.0)
    wait_for(lambda: _waits_in_flock(second), timeout=5, interval=0.005)
    assert answer == []  # still waiting: the first holds it
    first.release()
    waiting.join(timeout=5)
    assert answer == [True]
    assert not third.acquire(0.05)  # the second holds it now, alone
    second.release()
    assert third.acquire(0.5)
    third.release()


def test_a_writer_that_gave_up_leaves_the_lock_to_the_others(tmp_path: Path) -> None:
    # The second's thread still waits in flock after its writer gave up; when it gets the
    # lock it lets it go at once, and a try of the second's own in between cannot take a
    # lock its thread is about to let go (an flock its descriptor holds would succeed).
    first, second, third = _queues(tmp_path, 3)
    assert first.acquire(1.0)
    assert not second.acquire(0.02)
    assert _waits_in_flock(second)
    first.release()
    assert third.acquire(2.0)
    assert not second.acquire(0.05)
    third.release()
    assert second.acquire(2.0)
    assert not first.acquire(0.05)
    second.release()


def test_the_waiting_thread_ends_when_nobody_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_Waiter, "IDLE_SECONDS", 0.05)
    first, second = _queues(tmp_path, 2)
    assert first.acquire(1.0)
    assert not second.acquire(0.02)
    first.release()
    assert second.acquire(1.0)
    second.release()
    wait_for(
        lambda: not any(t.name == "sp00ky-sqlite-writers" for t in threading.enumerate()),
        timeout=5,
        interval=0.01,
    )
    assert first.acquire(1.0)  # and comes again for the next writer that waits
    waiting, answer = _acquire_in_thread(second, 10.0)
    wait_for(lambda: _waits_in_flock(second), timeout=5, interval=0.005)
    first.release()
    waiting.join(timeout=5)
    assert answer == [True]
    second.release()


def test_a_store_writes_from_several_processes_through_the_queue(sqlite_url: str) -> None:
    store = open_store(sqlite_url)
    try:
        store.enqueue_many([new(payload={"n": n}) for n in range(40)], T0)
        context = multiprocessing.get_context("fork")
        with context.Pool(2) as pool:
            claimed = pool.map(_claim_all, [sqlite_url] * 2)
        ids = [job for batch in claimed for job in batch]
        assert len(ids) == len(set(ids)) == 40
        assert store.counts()["success"] == 40
    finally:
        store.close()


def _claim_all(url: str) -> list[str]:
    store = open_store(url, migrate=False)
    done: list[str] = []
    try:
        while jobs := store.claim("render_job", 4, "controller-1", T0, LEASE, machine="m1"):
            store.complete_many([(job.id, job.attempt or "", None) for job in jobs], T0)
            done += [job.id for job in jobs]
    finally:
        store.close()
    return done
