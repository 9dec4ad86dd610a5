"""Schedules in the store (store/schedules.py), on real SQLite and real PostgreSQL: one fire
per (schedule, fire time), the concurrency policies, runs following their jobs, retention."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from sp00ky_infra.store import NewJob, QueueFull, SqlStore, open_store
from sp00ky_infra.store.schedules import Fired, ScheduleTable

NEW = NewJob(backend="renderer", table="render_job", path="/render", payload={"n": 1})
HOUR = 3600.0


def jobs_of(store: SqlStore) -> list[str]:
    return sorted(job.id for job in store.list_jobs(table="render_job", limit=1000))


def test_a_fire_writes_its_run_and_job_together_and_happens_once(store: SqlStore) -> None:
    table = ScheduleTable(store)
    fired = table.fire("nightly", 100.0, 101.0, "allow", NEW)
    assert fired is not None and fired.action == "fire"
    job = store.get(fired.run.job_id or "")
    assert (job.status, job.path, job.payload, job.table) == (
        "pending",
        "/render",
        {"n": 1},
        "render_job",
    )
    assert table.fire("nightly", 100.0, 102.0, "allow", NEW) is None  # the same fire again
    assert table.fire("nightly", 40.0, 102.0, "allow", NEW) is None  # an older one
    assert jobs_of(store) == [job.id]
    assert table.states(["nightly"], 500.0)["nightly"].last_fire_at == 100.0
    [run] = table.runs("nightly")
    assert (run.fire_at, run.fired_at, run.status, run.job_id) == (100.0, 101.0, "pending", job.id)


def test_first_seen_is_recorded_once(store: SqlStore) -> None:
    table = ScheduleTable(store)
    assert table.states(["a", "b"], 10.0)["a"].first_seen_at == 10.0
    later = table.states(["a", "b"], 20.0)
    assert (later["a"].first_seen_at, later["b"].first_seen_at) == (10.0, 10.0)
    assert later["a"].last_fire_at is None


def test_skip_records_a_skipped_run_while_the_previous_one_runs(store: SqlStore) -> None:
    table = ScheduleTable(store)
    first = table.fire("sync", 60.0, 60.0, "skip", NEW)
    assert first is not None
    second = table.fire("sync", 120.0, 120.0, "skip", NEW)
    assert second is not None and second.action == "skip"
    assert (second.run.status, second.run.job_id, second.run.finished_at) == (
        "skipped",
        None,
        120.0,
    )
    [claimed] = store.claim("render_job", 1, "test", 121.0, lease=90)
    assert table.sync(121.0) == [(first.run.id, "processing")]
    skipped = table.fire("sync", 180.0, 180.0, "skip", NEW)
    assert skipped is not None and skipped.action == "skip"  # processing counts as running
    store.complete(claimed.id, claimed.attempt or "", {"ok": True}, 200.0)
    assert table.sync(201.0) == [(first.run.id, "success")]
    again = table.fire("sync", 240.0, 240.0, "skip", NEW)
    assert again is not None and again.action == "fire"
    assert [run.status for run in table.runs("sync")] == [
        "pending",
        "skipped",
        "skipped",
        "success",
    ]
    assert len(jobs_of(store)) == 2


def test_replace_marks_the_previous_run_replaced_and_names_its_job(store: SqlStore) -> None:
    table = ScheduleTable(store)
    first = table.fire("sync", 60.0, 60.0, "replace", NEW)
    assert first is not None
    second = table.fire("sync", 120.0, 120.0, "replace", NEW)
    assert isinstance(second, Fired) and second.action == "replace"
    assert second.replaced_jobs == (first.run.job_id,)
    assert table.replaced_still_running() == [first.run.job_id]
    store.kill(first.run.job_id or "", 121.0)
    assert table.replaced_still_running() == []
    assert table.sync(122.0) == []  # a replaced run stays replaced
    assert [run.status for run in table.runs("sync")] == ["pending", "replaced"]
    assert store.get(first.run.job_id or "").status == "failed"


def test_allow_runs_both(store: SqlStore) -> None:
    table = ScheduleTable(store)
    for at in (60.0, 120.0, 180.0):
        fired = table.fire("sync", at, at, "allow", NEW)
        assert fired is not None and fired.action == "fire"
    assert [job.status for job in store.list_jobs(table="render_job")] == ["pending"] * 3


def test_runs_follow_their_jobs_to_the_end(store: SqlStore) -> None:
    table = ScheduleTable(store)
    ok, killed, failed = (table.fire(name, 60.0, 60.0, "allow", NEW) for name in "abc")
    assert ok is not None and killed is not None and failed is not None
    claimed = {job.id: job for job in store.claim("render_job", 3, "test", 61.0, lease=90)}
    store.complete(ok.run.job_id or "", claimed[ok.run.job_id or ""].attempt or "", 1, 62.0)
    store.kill(killed.run.job_id or "", 62.0)
    job = claimed[failed.run.job_id or ""]
    store.fail_attempt(job.id, job.attempt or "", {"code": "backend_error"}, 62.0, retryable=False)
    store.confirm_cancel(
        killed.run.job_id or "", claimed[killed.run.job_id or ""].attempt or "", 63
    )
    table.sync(64.0)
    assert [table.runs(name)[0].status for name in "abc"] == ["success", "killed", "failed"]
    assert table.runs("a")[0].finished_at == 62.0


def test_retention_keeps_skipped_and_replaced_for_the_success_window(store: SqlStore) -> None:
    table = ScheduleTable(store)
    table.fire("sync", 0.0, 0.0, "replace", NEW)  # replaced at 60
    table.fire("sync", 60.0, 60.0, "replace", NEW)  # skipped below, then left pending
    table.fire("sync", 120.0, 120.0, "skip", NEW)  # skipped
    [first, _] = sorted(store.list_jobs(table="render_job"), key=lambda job: job.created_at)
    store.kill(first.id, 61.0)
    statuses = [(run.fire_at, run.status) for run in table.runs("sync")]
    assert statuses == [(120.0, "skipped"), (60.0, "pending"), (0.0, "replaced")]
    default = (6 * HOUR, 30 * 24 * HOUR)
    assert table.prune(60.0 + 6 * HOUR - 1, {}, default) == 0  # within the success window
    assert table.prune(120.0 + 6 * HOUR + 1, {}, default) == 2
    assert [run.status for run in table.runs("sync")] == ["pending"]  # open runs never go
    totals = table.totals("sync")
    assert totals["pruned"]["skipped"] == 1 and totals["pruned"]["replaced"] == 1
    assert totals["kept"]["pending"] == 1


def test_a_schedule_may_keep_its_runs_for_less(store: SqlStore) -> None:
    table = ScheduleTable(store)
    for name in ("noisy", "quiet"):
        table.fire(name, 0.0, 0.0, "skip", NEW)
        table.fire(name, 60.0, 60.0, "skip", NEW)  # skipped at 60
    default = (24 * HOUR, 30 * 24 * HOUR)
    assert table.prune(60.0 + 16 * 60, {"noisy": (15 * 60, 30 * 24 * HOUR)}, default) == 1
    assert [run.status for run in table.runs("noisy")] == ["pending"]
    assert [run.status for run in table.runs("quiet")] == ["skipped", "pending"]


def test_failed_runs_are_kept_for_the_failed_window(store: SqlStore) -> None:
    table = ScheduleTable(store)
    fired = table.fire("sync", 0.0, 0.0, "skip", NEW)
    assert fired is not None
    store.kill(fired.run.job_id or "", 10.0)
    table.sync(11.0)
    assert table.prune(10.0 + 2 * HOUR, {}, (HOUR, 3 * HOUR)) == 0
    assert table.prune(10.0 + 3 * HOUR + 1, {}, (HOUR, 3 * HOUR)) == 1
    assert table.totals("sync")["pruned"]["killed"] == 1


def race(store_url: str, count: int, action: Callable[[SqlStore], None]) -> None:
    """``action`` run at once on ``count`` stores of their own, as that many controllers."""
    stores = [open_store(store_url) for _ in range(count)]
    start = threading.Barrier(count)

    def run(other: SqlStore) -> None:
        start.wait()
        action(other)

    threads = [threading.Thread(target=run, args=(each,)) for each in stores]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        for each in stores:
            each.close()


def test_racing_controllers_make_each_fire_once(store_url: str, store: SqlStore) -> None:
    """Four stores (as four controllers would have) make the same ten fires at once."""
    results: list[Fired | None] = []
    lock = threading.Lock()

    def fire_all(other: SqlStore) -> None:
        table = ScheduleTable(other)
        for minute in range(10):
            fired = table.fire("sync", minute * 60.0, minute * 60.0 + 1, "allow", NEW)
            with lock:
                results.append(fired)

    race(store_url, 4, fire_all)
    made = [fired for fired in results if fired is not None]
    assert sorted(fired.run.fire_at for fired in made) == [minute * 60.0 for minute in range(10)]
    assert len(jobs_of(store)) == 10
    assert len(ScheduleTable(store).runs("sync", limit=100)) == 10


def test_retention_in_batches_keeps_each_schedule_to_its_window(store: SqlStore) -> None:
    """Short and long windows mixed, pruned two rows at a time: each run goes exactly when
    its own schedule's window has passed, and every one is counted."""
    table = ScheduleTable(store)
    for name in ("short", "long", "default"):
        table.fire(name, 0.0, 0.0, "skip", NEW)  # pending: never pruned
        for minute in range(1, 6):
            table.fire(name, minute * 60.0, minute * 60.0, "skip", NEW)  # skipped at minute
    windows = {"short": (120.0, HOUR), "long": (HOUR, HOUR)}
    default = (600.0, HOUR)
    assert table.prune(300.0 + 121, windows, default, batch=2) == 5  # short: every skip
    assert table.prune(660.0 + 0.5, windows, default, batch=2) == 1  # default: the first
    kept = {name: len(table.runs(name)) for name in ("short", "long", "default")}
    assert kept == {"short": 1, "long": 6, "default": 5}
    assert table.prune(300.0 + HOUR + 1, windows, default, batch=2) == 9
    assert table.totals("long")["pruned"]["skipped"] == 5
    assert table.totals("default")["pruned"]["skipped"] == 5


def test_a_fire_into_a_full_queue_is_refused_and_made_later(store: SqlStore) -> None:
    table = ScheduleTable(store)
    pooled = NewJob(backend="renderer", table="render_job", path="/render", pool="render")
    store.enqueue(pooled, 0.0)
    with pytest.raises(QueueFull, match="maxQueued 1"):
        table.fire("sync", 60.0, 60.0, "allow", pooled, max_queued=1)
    assert table.runs("sync") == [] and len(jobs_of(store)) == 1  # nothing made
    made = table.fire("sync", 60.0, 61.0, "allow", pooled, max_queued=2)
    assert made is not None and made.action == "fire"
