"""An aborted stop's attempts go back to the queue at once, without spending a retry, on
SQLite and PostgreSQL alike (controller/stopping.py)."""

from __future__ import annotations

from sp00ky_infra.controller.stopping import STOPPED, Progress, progress, release
from sp00ky_infra.store import SqlStore
from sp00ky_infra.store.model import CANCELLED
from tests.store.test_store_contract import LEASE, T0, claim_one, new


def test_a_running_attempt_goes_back_due_now_with_its_retries(store: SqlStore) -> None:
    job = store.enqueue(new(max_retries=1), T0)
    running = claim_one(store, T0 + 1, machine="m1")
    failed = store.fail_attempt(job.id, running.attempt, {"code": "backend_error",
                                                        "reason": "500"}, T0 + 2)  # fmt: skip
    assert failed.retries == 1
    again = claim_one(store, failed.run_after, machine="m1")
    assert release(store, ["m1"], failed.run_after + 3) == [job.id]
    back = store.get(job.id)
    assert back.status == "pending" and back.retries == 1  # no retry spent by the stop
    assert back.run_after == failed.run_after + 3 and back.machine is None
    assert back.attempts[-1]["id"] == again.attempt and back.attempts[-1]["outcome"] == STOPPED
    assert len(back.errors) == 1  # the stop is no error of the job's
    (next_try,) = store.claim("render_job", 1, "c", failed.run_after + 3, LEASE, machine="m2")
    assert next_try.id == job.id and next_try.attempt != again.attempt


def test_only_the_machines_named_and_a_killed_job_fails_as_cancelled(store: SqlStore) -> None:
    kept = store.enqueue(new(), T0)
    claim_one(store, T0 + 1, machine="other")
    killed = store.enqueue(new(), T0 + 0.5)
    claim_one(store, T0 + 1, machine="m1")
    store.kill(killed.id, T0 + 2)
    assert release(store, ["m1"], T0 + 3) == []
    assert store.get(kept.id).status == "processing"  # another machine's attempt: untouched
    ended = store.get(killed.id)
    assert ended.status == "failed" and ended.errors[-1]["code"] == CANCELLED


def test_progress_counts_live_leases_only(store: SqlStore) -> None:
    assert progress(store, T0) == Progress(0, 0)
    store.machines.add("m1", "render", "local", "rev", 1, T0)
    store.enqueue(new(), T0)
    claim_one(store, T0 + 1, machine="m1")
    assert progress(store, T0 + 2) == Progress(1, 1)
    assert progress(store, T0 + 1 + LEASE + 1) == Progress(1, 0)  # its agent went silent
    assert Progress(2, 1).line() == "stopping: 2 machines, 1 job running"
    assert Progress(1, 2).line() == "stopping: 1 machine, 2 jobs running"
