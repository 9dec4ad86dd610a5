"""The store's side of cancelling waiting jobs no pool takes: which groups wait, and the
cancel of one group's waiting jobs, each a compare-and-set that leaves a claimed job alone."""

from __future__ import annotations

from sp00ky_infra.store import SqlStore
from tests.helpers import render_job

T0 = 1_700_000_000.0


def test_waiting_routes_lists_each_group_of_waiting_pooled_jobs(store: SqlStore) -> None:
    store.enqueue(render_job(), T0)
    store.enqueue(render_job(), T0)
    store.enqueue(render_job(backend="thumbs", table="thumb_job", pool="thumb"), T0)
    store.enqueue(render_job(backend="mailer", table="mail_job", pool=None), T0)  # not pooled
    running = store.enqueue(render_job(backend="old", table="old_job", pool="render"), T0)
    store.claim("old_job", 1, "c", T0 + 1, 90.0, machine="m1")
    assert store.get(running.id).status == "processing"
    assert sorted(store.jobs.waiting_routes()) == [
        ("renderer", "render_job", "render"),
        ("thumbs", "thumb_job", "thumb"),
    ]


def test_cancel_waiting_fails_the_group_s_waiting_jobs_and_leaves_the_rest(
    store: SqlStore,
) -> None:
    waiting = [store.enqueue(render_job(), T0) for _ in range(3)]
    delayed = store.enqueue(render_job(delay_ms=60_000), T0)
    (running,) = store.claim("render_job", 1, "c", T0 + 1, 90.0, machine="m1")
    other = store.enqueue(render_job(backend="thumbs", table="thumb_job", pool="thumb"), T0)
    reason = "backend renderer no longer runs on pool render (it runs on pool gpu now)"
    first = store.jobs.cancel_waiting("renderer", "render_job", "render", reason, T0 + 2, 2)
    second = store.jobs.cancel_waiting("renderer", "render_job", "render", reason, T0 + 2, 2)
    assert len(first) == 2 and len(second) == 1
    assert store.jobs.cancel_waiting("renderer", "render_job", "render", reason, T0 + 3, 2) == []
    cancelled = set(first + second)
    assert cancelled == {j.id for j in (*waiting, delayed)} - {running.id}
    for job_id in cancelled:
        job = store.get(job_id)
        assert job.status == "failed"
        assert job.errors[-1]["code"] == "cancelled"
        assert job.errors[-1]["reason"] == f"{reason}; cancelled while waiting"
        assert job.payload is None and job.path == "/render"  # the row stays, retryable
    assert store.get(running.id).status == "processing"  # running work finishes
    assert store.get(other.id).status == "pending"
    rerun = store.retry(sorted(cancelled)[0], T0 + 4)
    assert rerun.status == "pending"
