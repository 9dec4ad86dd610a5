"""The attempt history: the hot path (a claim, a result in success) writes none of it, the row's
columns are its last entry, and every transition reads back the history it built; a store
migrated from a schema whose claims appended the running attempt's entry reads the same."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sp00ky_infra.store import SqlStore, StoreError, open_store
from sp00ky_infra.store import dialect as dialect_module
from sp00ky_infra.store.migrations import MIGRATIONS
from tests.store.test_store_contract import LEASE, T0, claim_one, new


def _column(store: SqlStore, job_id: str) -> list[dict[str, Any]]:
    with store.read() as cur:
        cur.execute("SELECT attempts FROM jobs WHERE id = ?", (job_id,))
        return list(json.loads(cur.fetchone()[0]))


def _entry(job: Any, ended: float | None, outcome: str | None) -> dict[str, Any]:
    return {
        "id": job.attempt,
        "number": job.attempt_number,
        "machine": job.machine,
        "started_at": job.started_at,
        "ended_at": ended,
        "outcome": outcome,
    }


def test_a_claim_and_its_results_write_no_history_yet_read_it_whole(store: SqlStore) -> None:
    ids = store.enqueue_many([new(payload={"n": n}) for n in range(5)], T0)
    running = store.claim("render_job", 5, "controller-1", T0 + 1, LEASE, machine="m1")
    assert {job.id for job in running} == set(ids)
    for job in running:
        assert job.attempts == (_entry(job, None, None),)
        assert store.get(job.id) == job
    # One batch of four (one statement) and one result on its own (the one-row statement).
    store.complete_many([(job.id, job.attempt or "", {"n": 1}) for job in running[:4]], T0 + 2)
    store.complete(running[4].id, running[4].attempt or "", None, T0 + 3)
    for job, ended in zip(running, [T0 + 2] * 4 + [T0 + 3], strict=True):
        done = store.get(job.id)
        assert done.status == "success"
        assert done.attempts == (_entry(job, ended, "success"),)
        assert _column(store, job.id) == []


def test_every_transition_reads_back_the_history_it_wrote(store: SqlStore) -> None:
    job = store.enqueue(new(max_retries=2), T0)
    first = claim_one(store, T0 + 1)
    # A failure that retries ends the entry in Python: the column holds it from then on.
    error = {"code": "backend_error", "reason": "500", "at": T0 + 2, "attempt": 1}
    retried = store.fail_attempt(job.id, first.attempt, error, T0 + 2)  # type: ignore[arg-type]
    assert retried.status == "pending"
    assert retried.attempts == (_entry(first, T0 + 2, "backend_error"),)
    assert store.get(job.id) == retried
    assert _column(store, job.id) == list(retried.attempts)

    second = claim_one(store, T0 + 100)
    assert second.attempts == (*retried.attempts, _entry(second, None, None))
    assert store.get(job.id) == second
    # A kill of the running attempt rewrites the row: the running entry stays off the column.
    killing = store.kill(job.id, T0 + 101)
    assert killing.cancel_requested and killing.attempts == second.attempts
    assert store.get(job.id) == killing
    assert _column(store, job.id) == list(retried.attempts)
    # Its late answer fails it (the whole transition): the entry ends as cancelled.
    late = store.complete_many([(job.id, second.attempt or "", {"late": True})], T0 + 102)
    assert late[0].status == "failed"
    failed = store.get(job.id)
    assert failed.attempts == (*retried.attempts, _entry(second, T0 + 102, "cancelled"))
    assert _column(store, job.id) == list(failed.attempts)

    rerun = store.retry(job.id, T0 + 200)
    assert rerun.attempts == failed.attempts and store.get(job.id) == rerun
    third = claim_one(store, T0 + 201)
    store.complete(job.id, third.attempt, "ok", T0 + 202)
    done = store.get(job.id)
    assert [(a["number"], a["outcome"]) for a in done.attempts] == [
        (1, "backend_error"),
        (2, "cancelled"),
        (3, "success"),
    ]
    assert done.attempts[-1] == _entry(third, T0 + 202, "success")
    assert _column(store, job.id) == list(failed.attempts)
    # A finished job run again after a success keeps that entry: the rewrite stores it.
    again = store.retry(job.id, T0 + 300)
    assert again.attempts == done.attempts and _column(store, job.id) == list(done.attempts)
    fourth = claim_one(store, T0 + 301)
    assert fourth.attempts == (*done.attempts, _entry(fourth, None, None))
    assert store.get(job.id) == fourth


def test_a_store_whose_claims_appended_the_entry_reads_the_same_after_migrating(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Schema 8, its rows as that code wrote them: a running row's column ends with the entry
    # of the attempt it runs, a finished row's with its closed entry.
    with monkeypatch.context() as patch:
        patch.setattr(dialect_module, "MIGRATIONS", MIGRATIONS[:8])
        old = open_store(store_url)
    try:
        assert old.schema_version() == 8
        running_id, done_id = old.enqueue_many([new(), new()], T0)
        with old.write() as cur:
            for job_id, status in ((running_id, "processing"), (done_id, "success")):
                entry = {
                    "id": f"att-{status}",
                    "number": 1,
                    "machine": "m1",
                    "started_at": T0 + 1,
                    "ended_at": None if status == "processing" else T0 + 2,
                    "outcome": None if status == "processing" else "success",
                }
                cur.execute(
                    "UPDATE jobs SET status = ?, attempt = ?, attempt_number = 1, machine = 'm1', "
                    "assignee = 'controller-1', started_at = ?, lease_expires_at = ?, "
                    "finished_at = ?, attempts = ? WHERE id = ?",
                    (status, entry["id"], T0 + 1, T0 + 1 + LEASE if status == "processing"
                     else None, entry["ended_at"], json.dumps([entry]), job_id),
                )  # fmt: skip
    finally:
        old.close()

    migrated = open_store(store_url)
    try:
        assert migrated.schema_version() == MIGRATIONS[-1].version
        running = migrated.get(running_id)
        assert running.attempts == (_entry(running, None, None),)
        assert _column(migrated, running_id) == []
        finished = migrated.get(done_id)
        assert finished.attempts == (_entry(finished, T0 + 2, "success"),)
        assert _column(migrated, done_id) == list(finished.attempts)
        # The migrated running attempt ends on the hot path with one closed entry.
        migrated.complete(running_id, "att-processing", None, T0 + 3)
        assert migrated.get(running_id).attempts == (_entry(running, T0 + 3, "success"),)
    finally:
        migrated.close()


def _write_old_claim(store: SqlStore, job_id: str, attempt: str) -> None:
    """The row as a build before migration 9 claimed it: the running entry in the column."""
    entry = {"id": attempt, "number": 1, "machine": "m1", "started_at": T0 + 1,
             "ended_at": None, "outcome": None}  # fmt: skip
    with store.write() as cur:
        cur.execute(
            "UPDATE jobs SET status = 'processing', attempt = ?, attempt_number = 1, "
            "machine = 'm1', assignee = 'controller-1', started_at = ?, lease_expires_at = ?, "
            "attempts = ? WHERE id = ?",
            (attempt, T0 + 1, T0 + 1 + LEASE, json.dumps([entry]), job_id),
        )


def test_an_entry_an_older_claim_left_open_ends_with_a_result_on_the_hot_path(
    store: SqlStore,
) -> None:
    # An older build claimed it after this one migrated the store (the column holds the
    # running entry); the hot path ends the attempt without touching the column.
    job = store.enqueue(new(), T0)
    _write_old_claim(store, job.id, "att-old")
    running = store.get(job.id)
    assert running.attempts == (_entry(running, None, None),)
    store.complete(job.id, "att-old", None, T0 + 2)
    done = store.get(job.id)
    assert done.attempts == (_entry(running, T0 + 2, "success"),)


def test_a_store_a_newer_build_migrated_is_refused_naming_both_versions(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    open_store(store_url).close()  # migrated by this build
    newest, older = MIGRATIONS[-1].version, MIGRATIONS[-2].version
    monkeypatch.setattr(dialect_module, "MIGRATIONS", MIGRATIONS[:-1])  # an older build
    with pytest.raises(StoreError, match=rf"schema is version {newest}, newer than .*\({older}\)"):
        open_store(store_url)
