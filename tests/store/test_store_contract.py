"""The job store's contract, run against real SQLite and real PostgreSQL alike.

Time is an argument: every call takes ``now``, so nothing here sleeps.
"""

from __future__ import annotations

from typing import Any

import pytest

from sp00ky_infra.store import (
    Conflict,
    InvalidJob,
    JobNotFound,
    NewJob,
    QueueFull,
    SqlStore,
    StaleAttempt,
    open_store,
)
from sp00ky_infra.store.migrations import MIGRATIONS
from sp00ky_infra.store.sqlite import SqliteStore

T0 = 1_700_000_000.0
LEASE = 90.0


def new(**fields: Any) -> NewJob:
    base: dict[str, Any] = {
        "backend": "renderer",
        "table": "render_job",
        "path": "/render",
        "payload": {"gameId": "g"},
    }
    return NewJob(**{**base, **fields})


def claim_one(store: SqlStore, now: float, machine: str = "m1", **options: Any) -> Any:
    (job,) = store.claim("render_job", 1, "controller-1", now, LEASE, machine=machine, **options)
    return job


# --- lifecycle ---------------------------------------------------------------------------------


def test_a_job_runs_pending_processing_success(store: SqlStore) -> None:
    job = store.enqueue(new(assigned_to="thread:abc"), T0)
    assert job.id.startswith("render_job:") and job.status == "pending"
    assert (job.retries, job.max_retries, job.retry_strategy, job.delay_ms) == (0, 3, "linear", 0)
    assert store.get(job.id) == job

    running = claim_one(store, T0 + 1)
    assert running.id == job.id and running.status == "processing"
    assert running.attempt and running.attempt_number == 1
    assert running.lease_expires_at == T0 + 1 + LEASE
    assert (running.machine, running.assignee, running.started_at) == ("m1", "controller-1", T0 + 1)
    assert [a["id"] for a in running.attempts] == [running.attempt]
    assert store.claim("render_job", 1, "controller-1", T0 + 1, LEASE) == []

    done = store.complete(job.id, running.attempt, {"url": "u"}, T0 + 2)
    assert done.status == "success" and done.result == {"url": "u"} and done.finished_at == T0 + 2
    assert done.attempts[-1]["outcome"] == "success" and done.attempts[-1]["ended_at"] == T0 + 2
    assert store.get(job.id) == done
    assert done.payload == {"gameId": "g"} and done.assigned_to == "thread:abc"


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"payload": None},
        {"payload": {"nested": [1, 2.5, None, True, "é"], "n": 7}},
        {"payload": (1, 2)},  # a tuple is written as JSON and comes back a list
        {"timeout": 30, "delay_ms": 1500, "priority": -2, "slots": 3, "max_retries": 0},
        {"retry_strategy": "exponential", "assigned_to": "m7", "pool": "render"},
        {"queue_timeout": 60, "max_job_duration": 3600},  # whole numbers, DOUBLE columns
        {"queue_timeout": 0.25, "timeout": 1.5, "max_job_duration": 7200.5},
    ],
)
def test_enqueue_returns_the_job_as_it_reads_back(store: SqlStore, fields: dict[str, Any]) -> None:
    """``enqueue`` builds the Job it returns from what it wrote (rows.pending_job) instead of
    reading it back: the two must be the same to the type of each field."""
    job = store.enqueue(new(**fields), T0 + 0.123456789)
    read = store.get(job.id)
    assert repr(job) == repr(read)
    assert job.as_json() == read.as_json()


def test_a_result_for_a_stale_attempt_is_refused(store: SqlStore) -> None:
    job = store.enqueue(new(), T0)
    running = claim_one(store, T0)
    with pytest.raises(StaleAttempt, match=f"attempt nope of {job.id} is no longer current"):
        store.complete(job.id, "nope", {}, T0 + 1)
    store.complete(job.id, running.attempt, {}, T0 + 1)
    with pytest.raises(StaleAttempt, match=r"\(the job is success\)"):
        store.complete(job.id, running.attempt, {}, T0 + 2)
    with pytest.raises(StaleAttempt):
        store.fail_attempt(job.id, running.attempt, {"code": "backend_error", "reason": "x"}, T0)


def test_missing_job(store: SqlStore) -> None:
    with pytest.raises(JobNotFound, match="no job 'render_job:nope'; `sp00ky-infra jobs list`"):
        store.get("render_job:nope")
    with pytest.raises(JobNotFound):
        store.kill("render_job:nope", T0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"path": "render"}, "path: 'render' must start with /"),
        ({"path": "/caf\u00e9"}, "path: '/caf\u00e9' must be printable ASCII without spaces"),
        ({"path": "/a b"}, "path: '/a b' must be printable ASCII without spaces"),
        ({"path": "/a\r\nX: 1"}, "must be printable ASCII without spaces"),
        ({"max_retries": -1}, "max_retries: must be 0 or more, not -1"),
        ({"retry_strategy": "random"}, "retry_strategy: must be linear or exponential"),
        ({"delay_ms": -5}, "delay: must be 0 or more milliseconds, not -5"),
        ({"timeout": 0}, "timeout: must be a positive number of seconds, not 0"),
        ({"slots": 0}, "slots: a job takes at least 1 slot, not 0"),
        ({"payload": {"x": {1, 2}}}, "payload: must be JSON"),
        ({"delay_ms": 1500.5}, "delay: must be a whole number, not 1500.5"),
        ({"max_retries": True}, "max_retries: must be a whole number, not True"),
        ({"priority": 1.0}, "priority: must be a whole number, not 1.0"),
        ({"slots": "2"}, "slots: must be a whole number, not '2'"),
        ({"timeout": float("nan")}, "timeout: must be a finite number of seconds, not nan"),
        ({"queue_timeout": True}, "queue_timeout: must be a finite number of seconds"),
        ({"max_job_duration": float("inf")}, "max_job_duration: must be a finite number"),
    ],
)
def test_invalid_jobs_are_refused_naming_the_field(
    store: SqlStore, fields: dict[str, Any], message: str
) -> None:
    with pytest.raises(InvalidJob, match=message.replace("(", r"\(").replace(")", r"\)")):
        store.enqueue(new(**fields), T0)
    assert store.counts()["pending"] == 0


# --- retries, backoff, delay, deadlines -----------------------------------------------------


def _fail(
    store: SqlStore, job_id: str, attempt: str, now: float, code: str = "backend_error"
) -> Any:
    return store.fail_attempt(job_id, attempt, {"code": code, "reason": "boom"}, now)


def test_linear_retries_then_failed_with_the_whole_history(store: SqlStore) -> None:
    job = store.enqueue(new(max_retries=2), T0)
    now = T0
    waits = []
    for attempt_number in (1, 2, 3):
        running = claim_one(store, now)
        assert running.attempt_number == attempt_number
        after = _fail(store, job.id, running.attempt, now)
        if after.status == "pending":
            waits.append(after.run_after - now)
            assert store.claim("render_job", 1, "c", after.run_after - 0.001, LEASE) == []
            now = after.run_after
    assert waits == [5.0, 10.0]
    assert after.status == "failed" and after.retries == 2
    assert [(e["code"], e["attempt"]) for e in after.errors] == [
        ("backend_error", 1),
        ("backend_error", 2),
        ("backend_error", 3),
    ]
    assert [a["outcome"] for a in after.attempts] == ["backend_error"] * 3


def test_exponential_backoff(store: SqlStore) -> None:
    job = store.enqueue(new(max_retries=4, retry_strategy="exponential"), T0)
    now, waits = T0, []
    for _ in range(4):
        running = claim_one(store, now)
        after = _fail(store, job.id, running.attempt, now)
        waits.append(after.run_after - now)
        now = after.run_after
    assert waits == [5.0, 10.0, 20.0, 40.0]


def test_no_retries_and_not_retryable(store: SqlStore) -> None:
    job = store.enqueue(new(max_retries=0), T0)
    assert _fail(store, job.id, claim_one(store, T0).attempt, T0).status == "failed"
    other = store.enqueue(new(), T0)
    running = claim_one(store, T0)
    after = store.fail_attempt(
        other.id, running.attempt, {"code": "backend_error", "reason": "422"}, T0, retryable=False
    )
    assert after.status == "failed" and after.retries == 0


def test_delay_keeps_a_job_pending_and_killable(store: SqlStore) -> None:
    job = store.enqueue(new(delay_ms=5000), T0)
    assert job.run_after == T0 + 5
    assert store.claim("render_job", 1, "c", T0 + 4.999, LEASE) == []
    assert claim_one(store, T0 + 5).id == job.id
    later = store.enqueue(new(delay_ms=30_000), T0)
    killed = store.kill(later.id, T0 + 1)
    assert killed.status == "failed" and killed.errors[-1]["code"] == "cancelled"


@pytest.mark.parametrize(
    ("timeout", "max_job_duration", "limit"),
    [(60.0, 3600.0, 60.0), (None, 3600.0, 3600.0), (7200.0, 3600.0, 3600.0), (None, None, None)],
)
def test_deadline_is_the_shorter_of_timeout_and_max_job_duration(
    store: SqlStore, timeout: float | None, max_job_duration: float | None, limit: float | None
) -> None:
    store.enqueue(new(timeout=timeout, max_job_duration=max_job_duration), T0)
    running = claim_one(store, T0 + 10)
    assert running.deadline == (None if limit is None else T0 + 10 + limit)


def test_an_attempt_past_its_deadline_times_out_and_retries(store: SqlStore) -> None:
    job = store.enqueue(new(timeout=30, max_retries=1), T0)
    running = claim_one(store, T0)
    store.renew([(job.id, running.attempt)], T0 + 29, LEASE)
    assert store.sweep(T0 + 29.9).total == 0
    report = store.sweep(T0 + 30.1)
    assert report.timed_out == (job.id,)
    after = store.get(job.id)
    assert after.status == "pending" and after.errors[-1]["code"] == "timeout"
    assert "ran past its deadline on machine m1" in after.errors[-1]["reason"]


# --- leases ------------------------------------------------------------------------------------


def test_one_renewal_of_a_polls_leases_extends_exactly_the_current_ones(store: SqlStore) -> None:
    """A poll's leases go in one call (one statement on PostgreSQL): the running attempts are
    extended, a stale attempt, a finished job's and an unknown job's are not."""
    for _ in range(4):
        store.enqueue(new(), T0)
    first, second, third, done = (claim_one(store, T0) for _ in range(4))
    store.complete(done.id, done.attempt, {}, T0 + 1)
    leases = [
        (first.id, first.attempt),
        (second.id, second.attempt),
        (third.id, "stale"),
        (done.id, done.attempt),
        ("job_unknown", "a1"),
        (third.id, third.attempt),
    ]
    assert store.renew(leases, T0 + 50, LEASE) == {first.id, second.id, third.id}
    for job in (first, second, third):
        assert store.get(job.id).lease_expires_at == T0 + 50 + LEASE
    assert store.get(done.id).lease_expires_at is None and store.get(done.id).status == "success"


def test_renewal_keeps_an_attempt_and_expiry_requeues_it(store: SqlStore) -> None:
    job = store.enqueue(new(max_retries=1), T0)
    running = claim_one(store, T0)
    assert store.renew([(job.id, running.attempt), (job.id, "stale")], T0 + 80, LEASE) == {job.id}
    assert store.sweep(T0 + 100).total == 0  # renewed at 80: good until 170
    report = store.sweep(T0 + 171)
    assert report.lease_expired == (job.id,)
    after = store.get(job.id)
    assert after.status == "pending" and after.retries == 1 and after.attempt is None
    assert after.errors[-1]["code"] == "lease_expired"
    # the old attempt can no longer report or renew
    with pytest.raises(StaleAttempt):
        store.complete(job.id, running.attempt, {}, T0 + 172)
    assert store.renew([(job.id, running.attempt)], T0 + 172, LEASE) == set()
    # the second expiry exhausts the retries
    second = claim_one(store, after.run_after)
    assert second.attempt != running.attempt and second.attempt_number == 2
    store.sweep(after.run_after + LEASE + 1)
    final = store.get(job.id)
    assert final.status == "failed" and [e["code"] for e in final.errors] == ["lease_expired"] * 2


# --- admission ---------------------------------------------------------------------------------


def test_admission_order_is_priority_then_age_then_id(store: SqlStore) -> None:
    first = store.enqueue(new(), T0)
    urgent = store.enqueue(new(priority=10), T0 + 1)
    second = store.enqueue(new(), T0 + 2)
    lowest = store.enqueue(new(priority=-1), T0 - 100)
    tied = sorted([store.enqueue(new(), T0 + 3).id, store.enqueue(new(), T0 + 3).id])
    order = [job.id for job in store.claim("render_job", 10, "c", T0 + 5, LEASE)]
    assert order == [urgent.id, first.id, second.id, *tied, lowest.id]


@pytest.mark.parametrize("concurrency", [None, 2])
def test_a_polls_claim_reads_its_started_attempts_as_their_jobs_say(
    store: SqlStore, concurrency: int | None
) -> None:
    # send_start: the claim the poll makes (without and with a concurrency cap), each attempt
    # it started read as a Started, in admission order, the same columns as the Job's.
    late = store.enqueue(new(payload={"n": 1}, timeout=30.0), T0 + 1)
    urgent = store.enqueue(new(payload={"n": 2}, priority=5, delay_ms=500), T0)
    store.enqueue(new(payload={"n": 3}), T0 + 2)
    with store.transaction():
        claimed = store.send_start(
            "render_job", 2, "c", T0 + 5, LEASE, machine="m1", concurrency=concurrency
        )
    started = claimed.result()
    assert [each.id for each in started] == [urgent.id, late.id]
    for each in started:
        job = store.get(each.id)
        assert job.status == "processing" and job.machine == "m1"
        assert (each.attempt, each.path, each.payload, each.deadline) == (
            job.attempt, job.path, job.payload, job.deadline
        )  # fmt: skip
        assert (each.lease_expires_at, each.run_after) == (T0 + 5 + LEASE, job.run_after)
    assert started[0].run_after == T0 + 0.5 and started[0].deadline is None
    assert started[1].deadline == T0 + 5 + 30.0


def test_the_head_waits_for_all_its_slots_and_nothing_overtakes_it(store: SqlStore) -> None:
    big = store.enqueue(new(slots=2), T0)
    small = store.enqueue(new(slots=1), T0 + 1)
    assert store.claim("render_job", 1, "c", T0 + 2, LEASE) == []
    assert [j.id for j in store.claim("render_job", 2, "c", T0 + 2, LEASE)] == [big.id]
    assert [j.id for j in store.claim("render_job", 1, "c", T0 + 2, LEASE)] == [small.id]


def test_max_queued_refuses_new_jobs(store: SqlStore) -> None:
    for _ in range(2):
        store.enqueue(new(pool="render"), T0, max_queued=2)
    with pytest.raises(
        QueueFull, match=r"pool 'render' already has 2 jobs waiting \(maxQueued 2\)"
    ):
        store.enqueue(new(pool="render"), T0, max_queued=2)
    assert store.counts(pool="render")["pending"] == 2
    claim_one(store, T0)  # one leaves the queue: room for one more
    store.enqueue(new(pool="render"), T0, max_queued=2)


def test_queue_timeout(store: SqlStore) -> None:
    job = store.enqueue(new(queue_timeout=10, delay_ms=2000), T0)
    assert job.queue_deadline == T0 + 12  # counted from when the job becomes eligible
    assert store.sweep(T0 + 11).total == 0
    assert store.claim("render_job", 1, "c", T0 + 12.5, LEASE) == []  # too late to start
    report = store.sweep(T0 + 12.5)
    assert report.queue_timed_out == (job.id,)
    after = store.get(job.id)
    assert after.status == "failed" and after.errors[-1]["code"] == "queue_timeout"


def test_table_concurrency_caps_jobs_in_flight(store: SqlStore) -> None:
    for _ in range(4):
        store.enqueue(new(), T0)
    started = store.claim("render_job", 5, "c", T0, LEASE, concurrency=2)
    assert len(started) == 2
    assert store.claim("render_job", 5, "c", T0, LEASE, concurrency=2) == []
    first = started[0]
    assert first.attempt is not None
    store.complete(first.id, first.attempt, {}, T0 + 1)
    assert len(store.claim("render_job", 5, "c", T0 + 1, LEASE, concurrency=2)) == 1


def test_tables_are_separate_queues(store: SqlStore) -> None:
    store.enqueue(new(table="other_job"), T0)
    assert store.claim("render_job", 1, "c", T0, LEASE) == []
    assert len(store.claim("other_job", 1, "c", T0, LEASE)) == 1


def test_the_waiting_jobs_are_read_due_in_admission_order_then_delayed_soonest_first(
    store: SqlStore,
) -> None:
    soon, late = 100_000, 600_000  # ms
    last = store.enqueue(new(delay_ms=late), T0)  # written first, due last
    low = store.enqueue(new(), T0 + 1)
    high = store.enqueue(new(priority=5), T0 + 2)
    behind = store.enqueue(new(delay_ms=soon), T0 + 3)
    ahead = store.enqueue(new(delay_ms=soon, priority=9), T0 + 3)  # due with it: priority
    later = store.enqueue(new(), T0 + 5)
    store.enqueue(new(table="other_job"), T0)  # another queue

    now = T0 + 10
    assert [job.id for job in store.queue("render_job", now)] == [high.id, low.id, later.id]
    assert [job.id for job in store.delayed("render_job", now)] == [ahead.id, behind.id, last.id]
    assert [job.id for job in store.delayed("render_job", now, 2)] == [ahead.id, behind.id]
    # once due, a delayed job joins the queue in admission order (priority first)
    due = [job.id for job in store.queue("render_job", T0 + 3 + soon / 1000)]
    assert due == [ahead.id, high.id, low.id, behind.id, later.id]


def _steps(store: SqliteStore, read: Any) -> int:
    """The work SQLite does for ``read()``: its virtual machine's steps, in hundreds, as its
    progress handler counts them (the same for the same plan and rows, whatever the load)."""
    counted = [0]
    conn = store._connection()
    conn.set_progress_handler(lambda: counted.__setitem__(0, counted[0] + 1) or 0, 100)
    try:
        read()
    finally:
        conn.set_progress_handler(None, 0)
    return counted[0]


def test_sqlite_reads_the_head_of_a_long_queue_without_sorting_the_queue(sqlite_url: str) -> None:
    # The first 50 due jobs and the first 50 delayed ones (the admin API's pool view reads
    # both), and another table's counts: the same work with 20,000 jobs waiting as with 100,
    # not a sort of all of them, nor a read of every job for a table that has none.
    store = open_store(sqlite_url)
    assert isinstance(store, SqliteStore)
    try:

        def reads() -> tuple[int, int, int]:
            now = T0 + 10
            return (
                _steps(store, lambda: store.queue("render_job", now, 50)),
                _steps(store, lambda: store.delayed("render_job", now, 50)),
                _steps(store, lambda: store.counts(table="other_job")),
            )

        store.enqueue_many([new(), new(delay_ms=60_000)] * 50, T0)
        few = reads()
        store.enqueue_many([new(), new(delay_ms=60_000)] * 10_000, T0)
        many = reads()
        assert store.counts(table="render_job") == {
            "pending": 20_100, "processing": 0, "success": 0, "failed": 0,
        }  # fmt: skip
    finally:
        store.close()
    assert all(more <= 2 * less + 1 for less, more in zip(few, many, strict=True)), (few, many)


# --- kill, retry, clear ------------------------------------------------------------------------


def test_kill_a_running_job_is_delivered_then_confirmed(store: SqlStore) -> None:
    job = store.enqueue(new(), T0)
    running = claim_one(store, T0, machine="m7")
    marked = store.kill(job.id, T0 + 1)
    assert marked.status == "processing" and marked.cancel_requested
    # what the machine's next poll reads (running_on) says the kill
    assert [(j.id, j.attempt) for j in store.running_on("m7") if j.cancel_requested] == [
        (job.id, running.attempt)
    ]
    assert store.running_on("m1") == []
    assert store.cancelling_machines() == {"m7"}
    done = store.confirm_cancel(job.id, running.attempt, T0 + 2)
    assert done.status == "failed" and done.errors[-1]["code"] == "cancelled"
    assert done.attempts[-1]["outcome"] == "cancelled"
    with pytest.raises(Conflict, match="already ended \\(failed\\); nothing to kill"):
        store.kill(job.id, T0 + 3)


def test_a_killed_job_whose_answer_arrives_fails_cancelled(store: SqlStore) -> None:
    job = store.enqueue(new(), T0)
    running = claim_one(store, T0)
    store.kill(job.id, T0 + 1)
    after = store.complete(job.id, running.attempt, {"url": "late"}, T0 + 2)
    assert after.status == "failed" and after.result is None
    assert after.errors[-1]["code"] == "cancelled" and after.errors[-1]["result"] == {"url": "late"}


def test_a_killed_job_on_a_dead_machine_is_not_retried(store: SqlStore) -> None:
    job = store.enqueue(new(), T0)
    claim_one(store, T0)
    store.kill(job.id, T0 + 1)
    store.sweep(T0 + LEASE + 1)
    after = store.get(job.id)
    assert after.status == "failed" and after.retries == 0
    assert after.errors[-1]["code"] == "cancelled"


def test_retry_reruns_a_finished_job_keeping_its_history(store: SqlStore) -> None:
    job = store.enqueue(new(max_retries=0), T0)
    first = claim_one(store, T0)
    _fail(store, job.id, first.attempt, T0 + 1)
    with pytest.raises(Conflict, match="still pending; only a finished job can be retried"):
        other = store.enqueue(new(), T0)
        store.retry(other.id, T0)
    again = store.retry(job.id, T0 + 2)
    assert again.status == "pending" and again.retries == 0 and again.run_after == T0 + 2
    second = claim_one(store, T0 + 2)
    assert second.id in (job.id, other.id)
    rerun = store.get(job.id) if second.id == job.id else claim_one(store, T0 + 2)
    assert rerun.attempt_number == 2 and len(rerun.attempts) == 2
    assert [e["code"] for e in rerun.errors] == ["backend_error"]


def test_clear_deletes_finished_jobs_only_and_counts_them(store: SqlStore) -> None:
    ok = store.enqueue(new(), T0)
    store.complete(ok.id, claim_one(store, T0).attempt, {}, T0 + 1)
    bad = store.enqueue(new(max_retries=0), T0)
    _fail(store, bad.id, claim_one(store, T0).attempt, T0 + 1)
    running = store.enqueue(new(), T0)
    claim_one(store, T0)
    waiting = store.enqueue(new(), T0)
    with pytest.raises(Conflict, match="clear deletes finished jobs only"):
        store.clear(status="pending")
    assert store.clear(batch=1) == 2
    assert {job.id for job in store.list_jobs()} == {running.id, waiting.id}
    assert {(c.outcome, c.count) for c in store.counters()} == {("success", 1), ("failed", 1)}


# --- retention ---------------------------------------------------------------------------------


def _finished(store: SqlStore, at: float, ok: bool = True, table: str = "render_job") -> str:
    job = store.enqueue(new(table=table, max_retries=0), at)
    (running,) = store.claim(table, 1, "c", at, LEASE)
    assert running.attempt is not None
    if ok:
        store.complete(job.id, running.attempt, {}, at)
    else:
        _fail(store, job.id, running.attempt, at)
    return job.id


def test_retention_prunes_by_outcome_and_folds_into_hourly_counters(store: SqlStore) -> None:
    hour = 3600.0
    old_ok = [_finished(store, T0 + i) for i in range(3)]
    old_bad = _finished(store, T0, ok=False)
    new_ok = _finished(store, T0 + 7 * hour)
    pending = store.enqueue(new(), T0 - 100 * hour)
    stuck = store.enqueue(new(table="stuck_job"), T0 - 100 * hour)
    store.claim("stuck_job", 1, "c", T0 - 100 * hour, LEASE)

    report = store.prune(T0 + 8 * hour, success_window=6 * hour, failed_window=14 * 86400)
    assert report.deleted == {"success": 3}
    remaining = {job.id for job in store.list_jobs(limit=50)}
    assert remaining == {old_bad, new_ok, pending.id, stuck.id}
    assert not remaining & set(old_ok)
    (counter,) = store.counters()
    assert (counter.table, counter.outcome, counter.count) == ("render_job", "success", 3)
    assert counter.hour == int(T0 // 3600) * 3600

    later = store.prune(T0 + 15 * 86400, success_window=6 * hour, failed_window=14 * 86400)
    assert later.deleted == {"success": 1, "failed": 1}
    assert {j.id for j in store.list_jobs()} == {pending.id, stuck.id}  # never pruned
    assert sum(c.count for c in store.counters()) == 5


def test_max_rows_trims_only_the_oldest_successful_rows(store: SqlStore) -> None:
    oks = [_finished(store, T0 + i) for i in range(5)]
    bad = [_finished(store, T0 + i, ok=False) for i in range(3)]
    other = [_finished(store, T0 + i, table="other_job") for i in range(2)]
    report = store.prune(T0 + 10, success_window=1e9, failed_window=1e9, max_rows=2, batch=2)
    assert report.deleted == {"success": 3}
    left = {job.id for job in store.list_jobs(limit=50)}
    assert left == {*oks[3:], *bad, *other}
    assert sum(c.count for c in store.counters("render_job")) == 3


# --- the store itself --------------------------------------------------------------------------


def test_migrations_apply_once_and_a_restart_loses_nothing(store_url: str) -> None:
    first = open_store(store_url)
    assert first.schema_version() == MIGRATIONS[-1].version  # the newest applied
    job = first.enqueue(new(), T0)
    running = claim_one(first, T0)
    first.close()
    again = open_store(store_url)
    try:
        assert again.migrate() == []
        assert again.get(job.id) == running
        assert again.counts() == {"pending": 0, "processing": 1, "success": 0, "failed": 0}
    finally:
        again.close()


def test_counts_and_listing(store: SqlStore) -> None:
    ids = [store.enqueue(new(pool="render"), T0 + i).id for i in range(3)]
    claim_one(store, T0 + 5)
    assert store.counts() == {"pending": 2, "processing": 1, "success": 0, "failed": 0}
    assert store.counts(pool="elsewhere") == {
        "pending": 0,
        "processing": 0,
        "success": 0,
        "failed": 0,
    }
    assert [job.id for job in store.list_jobs()] == ids[::-1]
    assert [job.id for job in store.list_jobs(status="pending", limit=1)] == [ids[2]]
    assert [job.id for job in store.queue("render_job", T0 + 5)] == ids[1:]


def test_enqueue_many_is_one_transaction_that_respects_max_queued(store: SqlStore) -> None:
    ids = store.enqueue_many([new(pool="render", payload={"n": n}) for n in range(5)], T0, 6)
    assert len(set(ids)) == 5 and store.counts()["pending"] == 5
    assert [job.payload["n"] for job in store.queue("render_job", T0)] == sorted(
        range(5), key=lambda n: ids[n]
    )
    with pytest.raises(QueueFull, match="already has 5 jobs waiting"):
        store.enqueue_many([new(pool="render"), new(pool="render")], T0, 6)
    assert store.counts()["pending"] == 5  # all or nothing
    with pytest.raises(InvalidJob, match="slots"):
        store.enqueue_many([new(), new(slots=0)], T0)
    assert store.counts()["pending"] == 5


def test_a_renewal_between_the_sweeps_read_and_write_wins(store: SqlStore) -> None:
    from sp00ky_infra.store.transitions import overdue

    job = store.enqueue(new(), T0)
    running = claim_one(store, T0)
    assert running.attempt is not None
    late = T0 + LEASE + 1
    reads = []

    def sweep_step(seen: Any) -> Any:
        reads.append(seen.lease_expires_at)
        if len(reads) == 1:  # another writer renews after this read, before the write
            assert store.renew([(job.id, running.attempt)], late, LEASE) == {job.id}
        found = overdue(seen, late)
        return None if found is None else found[1]

    after = store.jobs.transition(job.id, sweep_step)
    assert reads == [T0 + LEASE, late + LEASE]  # the stale write lost; the re-read saw the renewal
    assert after.status == "processing" and after.attempt == running.attempt
    assert store.get(job.id).lease_expires_at == late + LEASE


def test_a_kill_between_a_reports_read_and_write_is_not_lost(store: SqlStore) -> None:
    from sp00ky_infra.store.transitions import error_entry, finish

    job = store.enqueue(new(), T0)
    claim_one(store, T0)
    seen_kill: list[bool] = []

    def report_step(seen: Any) -> Any:  # what complete() does, with a kill racing it
        seen_kill.append(seen.cancel_requested)
        if len(seen_kill) == 1:
            store.kill(job.id, T0 + 1)
        if seen.cancel_requested:
            return finish(seen, "failed", T0 + 2, error=error_entry("cancelled", "k", seen, T0 + 2))
        return finish(seen, "success", T0 + 2, result={"ok": True})

    after = store.jobs.transition(job.id, report_step)
    assert seen_kill == [False, True]  # the write that missed the kill lost, and was redone
    assert after.status == "failed" and store.get(job.id).errors[-1]["code"] == "cancelled"
