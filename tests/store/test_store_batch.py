"""Results recorded a batch at a time (complete_many, as an agent's poll carries them) and
claims that start attempts in SQL: each result keeps every guarantee of ``complete`` alone,
on both dialects, and the rows they leave equal what the full transitions would write."""

from __future__ import annotations

from typing import Any

import pytest

from sp00ky_infra.store import SqlStore, open_store
from sp00ky_infra.store import sqlite as sqlite_dialect
from sp00ky_infra.store.model import CANCELLED, Conflict, Job, JobNotFound, StaleAttempt
from sp00ky_infra.store.rows import complete_attempts, start_attempts
from tests.store.test_store_contract import LEASE, T0, claim_one, new

# A time whose float needs 17 digits (SQLite's own float to JSON keeps 15): the attempt
# history must keep every one of them.
NOW = 1_700_000_000.1123457


def answer(job: Job, result: Any) -> tuple[str, str, Any]:
    """The result of ``job``'s current attempt, as a poll carries it."""
    assert job.attempt is not None
    return (job.id, job.attempt, result)


def test_a_batch_of_results_succeeds_and_closes_each_attempt(store: SqlStore) -> None:
    for n in range(3):
        store.enqueue(new(payload={"n": n}), T0)
    running = store.claim("render_job", 3, "controller-1", T0, LEASE, machine="m1")
    assert len(running) == 3
    for job in running:
        entry = job.attempts[-1]
        assert entry == {
            "id": job.attempt,
            "number": 1,
            "machine": "m1",
            "started_at": T0,
            "ended_at": None,
            "outcome": None,
        }
        assert job.status == "processing" and job.lease_expires_at == T0 + LEASE
    done = store.complete_many(
        [answer(job, {"answer": i}) for i, job in enumerate(running)], NOW, "m1"
    )
    assert [(each.job, each.status, each.code, each.refused) for each in done] == [
        (job.id, "success", "", None) for job in running
    ]
    assert [each.started_at for each in done] == [T0] * 3
    for i, job in enumerate(running):
        after = store.get(job.id)
        assert after.status == "success" and after.result == {"answer": i}
        assert after.finished_at == NOW and after.updated_at == NOW
        assert after.lease_expires_at is None and after.errors == ()
        assert after.attempts == ({**job.attempts[-1], "ended_at": NOW, "outcome": "success"},)


def test_a_second_attempt_closes_only_its_own_entry(store: SqlStore) -> None:
    job = store.enqueue(new(max_retries=1), T0)
    first = claim_one(store, T0)
    store.fail_attempt(job.id, first.attempt, {"code": "backend_error", "reason": "500"}, T0 + 1)
    second = claim_one(store, T0 + 100)
    assert second.attempt_number == 2 and len(second.attempts) == 2
    (done,) = store.complete_many([(job.id, second.attempt, None)], T0 + 101)
    assert done.status == "success"
    after = store.get(job.id)
    assert [entry["outcome"] for entry in after.attempts] == ["backend_error", "success"]
    assert after.attempts[0]["ended_at"] == T0 + 1
    assert after.attempts[1]["ended_at"] == T0 + 101 and after.result is None


def test_each_result_of_a_batch_is_recorded_or_refused_on_its_own(store: SqlStore) -> None:
    for _ in range(4):
        store.enqueue(new(), T0)
    ok, killed, stale, elsewhere = store.claim("render_job", 4, "c", T0, LEASE, machine="m1")
    store.kill(killed.id, T0 + 1)
    with store.transaction():
        done = store.complete_many(
            [
                answer(ok, {"n": 1}),
                answer(killed, {"late": True}),
                (stale.id, "not-the-attempt", {}),
                ("render_job:nope", "a", {}),
                answer(ok, {"n": 2}),  # the same result twice: stale the second time
            ],
            T0 + 2,
            "m1",
        )
        other = store.complete_many([answer(elsewhere, {})], T0 + 2, "m2")
    assert [each.status for each in done] == ["success", "failed", None, None, None]
    assert done[1].code == CANCELLED and done[1].refused is None
    assert isinstance(done[2].refused, StaleAttempt)
    assert isinstance(done[3].refused, JobNotFound)
    assert isinstance(done[4].refused, StaleAttempt)
    assert isinstance(other[0].refused, Conflict) and "m2" in str(other[0].refused)
    assert store.get(ok.id).result == {"n": 1}
    late = store.get(killed.id)
    assert late.status == "failed" and late.result is None
    assert late.errors[-1]["code"] == CANCELLED and late.errors[-1]["result"] == {"late": True}
    assert late.attempts[-1]["outcome"] == CANCELLED
    assert store.get(stale.id).status == "processing"
    assert store.get(elsewhere.id).status == "processing"


def test_a_batch_in_a_failed_transaction_is_undone_with_it(store: SqlStore) -> None:
    store.enqueue(new(), T0)
    job = claim_one(store, T0)
    with pytest.raises(RuntimeError), store.transaction():
        assert store.complete_many([answer(job, 1)], T0 + 1)[0].status == "success"
        raise RuntimeError("the poll failed after its results")
    assert store.get(job.id).status == "processing"
    assert store.complete_many([answer(job, 1)], T0 + 2)[0].status == "success"
    assert store.complete_many([], T0 + 3) == []


def test_complete_alone_is_a_batch_of_one(store: SqlStore) -> None:
    store.enqueue(new(), T0)
    job = claim_one(store, T0)
    done = store.complete(*answer(job, {"x": [1, 2]}), NOW)
    assert done.status == "success" and done.result == {"x": [1, 2]}
    assert done.attempts[-1]["ended_at"] == NOW
    with pytest.raises(StaleAttempt):
        store.complete(*answer(job, {}), NOW)


def test_claims_and_batches_larger_than_a_statement_go_in_chunks(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # SQLite starts a claim's attempts and records a batch of results a statement for at
    # most START_ROWS_MAX rows: a larger claim or batch goes in several, every row once.
    monkeypatch.setattr(sqlite_dialect, "START_ROWS_MAX", 2)
    for n in range(5):
        store.enqueue(new(payload={"n": n}), T0)
    running = store.claim("render_job", 5, "controller-1", T0, LEASE, machine="m1")
    assert len(running) == len({job.attempt for job in running}) == 5
    for job in running:
        assert store.get(job.id) == job
    done = store.complete_many([answer(job, {"n": job.payload["n"]}) for job in running], NOW)
    assert [each.status for each in done] == ["success"] * 5
    assert [store.get(job.id).result for job in running] == [job.payload for job in running]


def test_sqlite_writes_a_claim_and_a_batch_of_results_by_id(sqlite_url: str) -> None:
    # With statistics that make the partial indexes on status look cheap, the statements
    # that start attempts and record results still find each row by its id.
    store = open_store(sqlite_url)
    try:
        store.enqueue_many([new(payload={"n": n}) for n in range(3000)], T0)
        store.claim("render_job", 1000, "controller-1", T0, LEASE, machine="m1")
        with store.read() as cur:
            cur.execute("ANALYZE")
            plans = []
            for sql, variables in ((start_attempts(3), 5 + 9), (complete_attempts(3), 4 + 9)):
                cur.execute("EXPLAIN QUERY PLAN " + sql, [None] * variables)
                plans.append(" / ".join(row[3] for row in cur.fetchall()))
    finally:
        store.close()
    for plan in plans:
        assert "SEARCH jobs USING INDEX sqlite_autoindex_jobs_1 (id=?)" in plan, plan
