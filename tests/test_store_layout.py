"""Where the store puts job rows and how much it writes for them: rows that are claimed
together lie together (a claim and its results change a few pages, not a page a job), on
both dialects."""

from __future__ import annotations

import re

from sp00ky_infra.store import SqlStore, open_store
from sp00ky_infra.store.postgres import GENERIC_PLANS
from sp00ky_infra.store.rows import COMPLETE_ATTEMPTS_PG, START_ATTEMPTS_PG
from tests.test_store_contract import LEASE, T0, new


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


def test_batched_writes_find_their_rows_by_id_on_a_table_never_analyzed(
    postgres_url: str,
) -> None:
    # A burst of enqueues leaves the table without statistics: the batched claims and
    # results must still look their rows up by id, not read every pending or running job
    # through a partial index on status that the planner believes nearly empty.
    store = open_store(postgres_url)
    try:
        store.enqueue_many([new(payload={"n": n}) for n in range(3000)], T0)
        running = store.claim("render_job", 16, "controller-1", T0, LEASE, machine="m1")
        head = [job.id for job in store.queue("render_job", T0, limit=16)]
        plans = []
        with store._write() as cur:
            cur.execute(GENERIC_PLANS)
            for sql, params in [
                (START_ATTEMPTS_PG, ("o", "m1", T0, T0, T0, head, head, [None] * 16, ["{}"] * 16,
                                     ["pending"] * 16)),
                (COMPLETE_ATTEMPTS_PG, (T0, T0, "1.0", [job.id for job in running],
                                        [job.attempt for job in running], [None] * 16,
                                        ["processing"] * 16, None, None)),
            ]:  # fmt: skip
                cur.execute("EXPLAIN " + sql, params)
                plans.append("\n".join(row[0] for row in cur.fetchall()))
            raise Rollback
    except Rollback:
        pass
    finally:
        store.close()
    for plan in plans:  # by id (or, on so small a table, one pass), never a status index
        assert not re.search(r"jobs_(queue|pending_due|running|lease|deadline)", plan), plan


class Rollback(Exception):
    """Leaves the EXPLAINed statements' transaction undone."""
