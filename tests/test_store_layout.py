"""Where the store puts job rows and how much it writes for them: rows that are claimed
together lie together (a claim and its results change a few pages, not a page a job), on
both dialects."""

from __future__ import annotations

from sp00ky_infra.store import SqlStore
from tests.test_store_contract import T0, new


def physical_order(store: SqlStore) -> list[str]:
    """The jobs' ids in the order the database laid the rows down (SQLite's rowid,
    PostgreSQL's tuple id, which for rows never updated is the order they were written)."""
    order = "ctid" if store.arrays else "rowid"
    with store._cursor() as cur:
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
