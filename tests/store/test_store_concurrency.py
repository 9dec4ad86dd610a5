"""Real processes on one store: claims never collide, and kill -9 leaves no half-written row."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time

import pytest

from sp00ky_infra.store import NewJob, SqlStore, open_store
from tests.helpers import ROOT


def _workers(url: str, count: int, *extra: str) -> list[subprocess.Popen[str]]:
    """Start ``count`` claiming processes and release them together."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.store_worker", url, *extra],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    for proc in procs:  # nothing is printed after "ready" until "go": no line is read ahead
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    return procs


def _fill(store: SqlStore, count: int) -> set[str]:
    now = time.time()
    return {
        store.enqueue(NewJob("renderer", "render_job", "/render", {"n": n}), now).id
        for n in range(count)
    }


def test_two_processes_never_claim_the_same_job(store_url: str, store: SqlStore) -> None:
    ids = _fill(store, 600)
    workers = _workers(store_url, 2)
    claimed = []
    for proc in workers:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        claimed.append(out.split())
    first, second = (set(each) for each in claimed)
    assert len(claimed[0]) == len(first) and len(claimed[1]) == len(second)
    assert first.isdisjoint(second)
    assert first | second == ids
    assert first and second, "both processes took part"
    jobs = store.list_jobs(limit=1000)
    assert {job.status for job in jobs} == {"success"}
    assert {job.attempt_number for job in jobs} == {1}
    for job in jobs:  # each result was recorded by the process that claimed the job
        assert job.result == {"by": job.machine}


def test_kill_9_in_the_middle_of_claims_leaves_no_half_written_row(
    store_url: str, store: SqlStore
) -> None:
    _fill(store, 3000)
    rng = random.Random(7)
    for _ in range(8):
        (victim,) = _workers(store_url, 1, "--forever", "--slots", "3")
        time.sleep(rng.uniform(0.02, 0.15))
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        for pipe in (victim.stdin, victim.stdout):
            assert pipe is not None
            pipe.close()
    fresh = open_store(store_url, migrate=False)
    try:
        jobs = fresh.list_jobs(limit=5000)
        assert len(jobs) == 3000
        running = [job for job in jobs if job.status == "processing"]
        assert running, "the victims claimed something"
        for job in jobs:
            if job.status == "processing":
                assert job.attempt and job.lease_expires_at and job.machine and job.assignee
                assert job.attempt_number == len(job.attempts) == 1
                assert job.attempts[-1]["id"] == job.attempt
            else:
                assert job.status == "pending"
                assert job.attempt is None and job.attempts == () and job.attempt_number == 0
        if store_url.startswith("sqlite"):
            import sqlite3

            path = store_url.removeprefix("sqlite:///")
            with sqlite3.connect(path) as conn:
                assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        fresh.close()


@pytest.mark.parametrize("slots", [1, 3])
def test_another_process_claims_in_admission_order(
    store_url: str, store: SqlStore, slots: int
) -> None:
    now = time.time() - 10
    high = [
        store.enqueue(NewJob("r", "render_job", "/render", priority=5), now).id for _ in range(5)
    ]
    _fill(store, 20)
    (proc,) = _workers(store_url, 1, "--slots", str(slots), "--idle", "5")
    out, _ = proc.communicate(timeout=60)
    assert out.split()[:5] == sorted(high)  # same priority and age: by id
