"""Fan-out schedules in the store (store/fan_out.py), on real SQLite and real PostgreSQL: each
row of a fire made once, whichever controller writes it; concurrency per row; the query run
read-only within its limits; pausing kept in the store."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sp00ky_infra.policy.schedules import FanOutRefused, fan_out_items
from sp00ky_infra.store import NewJob, SqlStore, open_store
from sp00ky_infra.store.fan_out import FanOutQueryError, FanOuts, read_only_rows
from sp00ky_infra.store.schedules import INSERT_RUN, Run, ScheduleTable
from tests.store.test_schedules_store import race

POOLED = NewJob(backend="renderer", table="render_job", path="/sync", pool="render")


def job_for(item: str) -> NewJob:
    return NewJob(backend="renderer", table="render_job", path="/sync", payload={"id": item})


def jobs_by_item(store: SqlStore) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job in store.list_jobs(table="render_job", limit=10_000):
        counts[job.payload["id"]] = counts.get(job.payload["id"], 0) + 1
    return counts


def items(count: int) -> list[str]:
    return [str(number) for number in range(count)]


def make_tenants(store: SqlStore, count: int) -> None:
    with store.write() as sql:
        sql.execute("CREATE TABLE tenant (id INTEGER PRIMARY KEY, name TEXT)")
        sql.executemany(
            "INSERT INTO tenant (id, name) VALUES (?, ?)", [(n, f"t{n}") for n in range(count)]
        )


def test_a_fire_opens_once_and_each_rows_job_is_written_once(store: SqlStore) -> None:
    fan_outs = FanOuts(store)
    assert fan_outs.open("sync", 60.0, 61.0, items(5))
    assert not fan_outs.open("sync", 60.0, 62.0, items(9))  # the same fire again: nothing
    waiting = fan_outs.waiting("sync", 100)
    assert sorted(each.item for each in waiting) == items(5)
    first = fan_outs.fire_items("sync", waiting[:2], 62.0, "skip", job_for)
    assert [item for item, _ in first.made] == [each.item for each in waiting[:2]]
    again = fan_outs.fire_items("sync", waiting, 63.0, "skip", job_for)  # a stale batch
    assert len(again.made) == 3 and not again.full
    assert jobs_by_item(store) == {item: 1 for item in items(5)}
    assert fan_outs.waiting("sync", 100) == []
    runs = ScheduleTable(store).runs("sync", 100)
    assert sorted(run.item for run in runs) == items(5)
    assert {run.status for run in runs} == {"pending"} and all(run.job_id for run in runs)


def test_a_standby_finishes_what_a_dead_leader_left(store_url: str, store: SqlStore) -> None:
    """The leader opened the fire and wrote one batch; its successor, on a store of its own,
    writes the rest: every row once."""
    FanOuts(store).open("sync", 60.0, 61.0, items(30))
    leader = FanOuts(store)
    leader.fire_items("sync", leader.waiting("sync", 10), 61.0, "skip", job_for)
    standby_store = open_store(store_url)
    try:
        standby = FanOuts(standby_store)
        assert not standby.open("sync", 60.0, 70.0, items(30))  # the fire is made: not twice
        while batch := standby.waiting("sync", 7):
            standby.fire_items("sync", batch, 70.0, "skip", job_for)
    finally:
        standby_store.close()
    assert jobs_by_item(store) == {item: 1 for item in items(30)}


def test_racing_controllers_write_each_row_once(store_url: str, store: SqlStore) -> None:
    FanOuts(store).open("sync", 60.0, 61.0, items(200))

    def write_rows(other: SqlStore) -> None:
        fan_outs = FanOuts(other)
        while batch := fan_outs.waiting("sync", 25):
            fan_outs.fire_items("sync", batch, 62.0, "skip", job_for)

    race(store_url, 3, write_rows)
    assert jobs_by_item(store) == {item: 1 for item in items(200)}


def test_skip_applies_per_row(store: SqlStore) -> None:
    fan_outs = FanOuts(store)
    fan_outs.open("sync", 60.0, 60.0, ["1", "2"])
    fan_outs.fire_items("sync", fan_outs.waiting("sync", 10), 60.0, "skip", job_for)
    done = [job for job in store.list_jobs(table="render_job") if job.payload["id"] == "1"]
    store.kill(done[0].id, 61.0)  # row 1's job ended; row 2's still waits
    fan_outs.open("sync", 120.0, 120.0, ["1", "2", "3"])
    later = fan_outs.fire_items("sync", fan_outs.waiting("sync", 10), 120.0, "skip", job_for)
    assert sorted(item for item, _ in later.made) == ["1", "3"] and later.without_job == 1
    runs = {(run.fire_at, run.item): run.status for run in ScheduleTable(store).runs("sync")}
    assert runs[(120.0, "2")] == "skipped"


def test_replace_applies_per_row_and_names_the_jobs_to_kill(store: SqlStore) -> None:
    fan_outs = FanOuts(store)
    fan_outs.open("sync", 60.0, 60.0, ["1", "2"])
    first = fan_outs.fire_items("sync", fan_outs.waiting("sync", 10), 60.0, "replace", job_for)
    fan_outs.open("sync", 120.0, 120.0, ["2"])
    later = fan_outs.fire_items("sync", fan_outs.waiting("sync", 10), 120.0, "replace", job_for)
    assert later.replaced_jobs == tuple(job for item, job in first.made if item == "2")
    runs = {(run.fire_at, run.item): run.status for run in ScheduleTable(store).runs("sync")}
    assert runs == {(60.0, "1"): "pending", (60.0, "2"): "replaced", (120.0, "2"): "pending"}


def test_a_row_not_yet_written_is_its_rows_previous_run(store: SqlStore) -> None:
    """Two fires' rows waiting at once (the queue was full): with replace, the later fire's
    row takes the earlier's place, which then never gets a job."""
    fan_outs = FanOuts(store)
    fan_outs.open("sync", 60.0, 60.0, ["1"])
    fan_outs.open("sync", 120.0, 120.0, ["1"])
    done = fan_outs.fire_items("sync", fan_outs.waiting("sync", 10), 120.0, "replace", job_for)
    assert len(done.made) == 1 and done.replaced_jobs == ()
    runs = {run.fire_at: run.status for run in ScheduleTable(store).runs("sync")}
    assert runs == {60.0: "replaced", 120.0: "pending"}


def test_rows_wait_for_room_in_the_pools_queue(store: SqlStore) -> None:
    fan_outs = FanOuts(store)
    fan_outs.open("sync", 60.0, 60.0, items(5))

    def pooled(item: str) -> NewJob:
        return NewJob("renderer", "render_job", "/sync", payload={"id": item}, pool="render")

    store.enqueue(POOLED, 0.0)
    done = fan_outs.fire_items("sync", fan_outs.waiting("sync", 10), 60.0, "skip", pooled, 3)
    assert len(done.made) == 2 and done.full
    assert len(fan_outs.waiting("sync", 10)) == 3  # the rest wait for room
    for job in store.list_jobs(table="render_job"):
        store.kill(job.id, 61.0)
    done = fan_outs.fire_items("sync", fan_outs.waiting("sync", 10), 62.0, "skip", pooled, 3)
    assert len(done.made) == 3 and not done.full
    assert fan_outs.waiting("sync", 10) == []


def test_a_failed_fire_is_a_run_saying_why(store: SqlStore) -> None:
    table = ScheduleTable(store)
    run = table.fail_fire("sync", 60.0, 61.0, "the query ran past its time limit (1s)")
    assert run is not None and table.fail_fire("sync", 60.0, 62.0, "again") is None
    [kept] = table.runs("sync")
    assert (kept.status, kept.job_id, kept.error) == ("failed", None, run.error)
    assert table.states(["sync"], 70.0)["sync"].last_fire_at == 60.0  # the next time is next


# --- the query: read-only, within its limits ------------------------------------------------


def test_the_query_reads_the_stores_database(store: SqlStore) -> None:
    make_tenants(store, 5)
    columns, rows = read_only_rows(store, "SELECT id, name FROM tenant ORDER BY id", 100, 5.0)
    assert columns == ("id", "name") and [row[0] for row in rows] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    "query",
    [
        "DELETE FROM tenant",
        "UPDATE tenant SET name = 'x'",
        "INSERT INTO tenant (id, name) VALUES (99, 'x')",
        "DROP TABLE tenant",
    ],
)
def test_a_query_that_writes_is_refused(store: SqlStore, query: str) -> None:
    """SQLite: the read-only connection refuses the write; PostgreSQL: its cursor takes a
    SELECT alone (and a write inside one meets the READ ONLY transaction, below)."""
    make_tenants(store, 3)
    with pytest.raises(FanOutQueryError, match="the query failed: "):
        read_only_rows(store, query, 100, 5.0)
    _, rows = read_only_rows(store, "SELECT id, name FROM tenant", 100, 5.0)
    assert sorted(rows) == [(0, "t0"), (1, "t1"), (2, "t2")]


def test_a_select_that_writes_is_refused(store: SqlStore) -> None:
    make_tenants(store, 3)
    if store.name == "postgres":
        with store.write() as sql:
            sql.execute(
                "CREATE FUNCTION wipe() RETURNS int LANGUAGE sql AS 'DELETE FROM tenant; SELECT 1'"
            )
        writes = [
            "SELECT wipe() AS id",
            "WITH d AS (DELETE FROM tenant RETURNING id) SELECT id FROM d",
        ]
        refusal = "read-only transaction|data-modifying"
    else:
        writes = ["DELETE FROM tenant RETURNING id"]
        refusal = "attempt to write a readonly database"
    for query in writes:
        with pytest.raises(FanOutQueryError, match=refusal):
            read_only_rows(store, query, 100, 5.0)
    assert len(read_only_rows(store, "SELECT id FROM tenant;", 100, 5.0)[1]) == 3


def test_a_second_statement_never_runs(store: SqlStore) -> None:
    make_tenants(store, 3)
    with pytest.raises(FanOutQueryError, match="the query failed"):
        read_only_rows(store, "SELECT id FROM tenant; DELETE FROM tenant", 100, 5.0)
    assert len(read_only_rows(store, "SELECT id FROM tenant", 100, 5.0)[1]) == 3


def test_a_slow_query_fails_at_its_time_limit(store: SqlStore) -> None:
    slow = (
        "SELECT pg_sleep(5) AS id"
        if store.name == "postgres"
        else "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
        "WHERE x < 1000000000) SELECT max(x) AS id FROM c"
    )
    with pytest.raises(FanOutQueryError, match=r"ran past its time limit \(0.3s\)"):
        read_only_rows(store, slow, 100, 0.3)


def test_rows_past_the_limit_fail_the_fire(store: SqlStore) -> None:
    make_tenants(store, 100)
    columns, rows = read_only_rows(store, "SELECT id FROM tenant", 10, 5.0)
    assert len(rows) == 11  # one more than allowed, and no more read
    refused = fan_out_items(columns, rows, "id", 10)
    assert refused == FanOutRefused(
        "the query returned more than maxRows (10) rows; narrow it or raise forEach.maxRows"
    )


# --- pausing ---------------------------------------------------------------------------------


def test_a_pause_is_kept_until_resumed(store_url: str, store: SqlStore) -> None:
    table = ScheduleTable(store)
    paused = table.set_paused("sync", True, 100.0)
    assert paused is not None and paused.paused_at == 100.0
    again = table.set_paused("sync", True, 200.0)
    assert again is not None and again.paused_at == 100.0  # paused since the first time
    reopened = open_store(store_url)  # a restarted controller
    try:
        state = ScheduleTable(reopened).states(["sync"], 300.0)["sync"]
        assert (state.paused_at, state.first_seen_at) == (100.0, 100.0)
    finally:
        reopened.close()
    resumed = table.set_paused("sync", False, 400.0)
    assert resumed is not None and (resumed.paused_at, resumed.resumed_at) == (None, 400.0)
    assert table.set_paused("never-seen", False, 400.0) is None


def test_a_row_of_a_fire_is_unique_in_the_store(store: SqlStore) -> None:
    """The key (schedule, fire time, row key) itself refuses a second run of a row, whatever
    wrote it; other rows and other fires are apart."""
    run = Run("run:a", "sync", 60.0, 60.0, "pending", None, None, "7")
    with store.write() as sql:
        for each in (run, replace(run, id="run:b"), replace(run, id="run:c", item="8")):
            sql.execute(INSERT_RUN, each.row())
        sql.execute(INSERT_RUN, replace(run, id="run:d", fire_at=120.0).row())
    kept = {(each.fire_at, each.item): each.id for each in ScheduleTable(store).runs("sync")}
    assert kept == {(60.0, "7"): "run:a", (60.0, "8"): "run:c", (120.0, "7"): "run:d"}
    assert FanOuts(store).open("sync", 180.0, 180.0, [])  # no row: the fire is made, empty
    assert FanOuts(store).waiting("sync", 10)[0].item == "7"
