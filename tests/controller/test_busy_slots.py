"""Each machine's busy slots, kept on its row by the database (migration 7's triggers), equal
the slots of the jobs running on it after anything a store does: claim, result, failure with
and without a retry, kill while waiting or running, cancel confirmed, a lease run out (a lost
machine), an attempt timed out, a finished job run again, finished jobs deleted, a machine
row added while jobs run under its name, a transaction rolled back. Random walks of those,
checked after every step, on both dialects."""

from __future__ import annotations

import random

import pytest

from sp00ky_infra.store import Conflict, JobNotFound, NewJob, SqlStore, StaleAttempt
from sp00ky_infra.store.model import ErrorEntry

T0 = 1_000_000.0
LEASE = 30.0
MACHINES = ("m1", "m2", "m3")
LATE = "m4"  # its row is added only after jobs ran under its name


class Rollback(Exception):
    pass


def drift(store: SqlStore) -> dict[str, tuple[int, int]]:
    """The machines whose kept busy slots differ from their running jobs': (kept, actual)."""
    with store.read() as cur:
        cur.execute("SELECT name, busy_slots FROM machines")
        kept = {name: int(busy) for name, busy in cur.fetchall()}
        cur.execute(
            "SELECT machine, sum(slots) FROM jobs WHERE status = 'processing' "
            "AND machine IS NOT NULL GROUP BY machine",
        )
        actual = {name: int(busy) for name, busy in cur.fetchall()}
    return {
        name: (kept[name], actual.get(name, 0))
        for name in kept
        if kept[name] != actual.get(name, 0)
    }


def running(store: SqlStore) -> list[tuple[str, str, bool]]:
    with store.read() as cur:
        cur.execute(
            "SELECT id, attempt, cancel_requested FROM jobs WHERE status = 'processing' "
            "ORDER BY id",
        )
        return [(job, attempt, bool(cancel)) for job, attempt, cancel in cur.fetchall()]


def ids(store: SqlStore, where: str) -> list[str]:
    with store.read() as cur:
        cur.execute(f"SELECT id FROM jobs WHERE {where} ORDER BY id")
        return [row[0] for row in cur.fetchall()]


def step(store: SqlStore, rng: random.Random, now: float, added: set[str]) -> str:
    """One random change of the store; what it was."""
    what = rng.choice(
        [
            "enqueue",
            "claim",
            "claim",
            "complete",
            "fail",
            "kill",
            "confirm",
            "sweep",
            "retry",
            "clear",
            "rollback",
            "late",
        ]
    )
    if what == "enqueue":
        news = [
            NewJob(
                "app",
                "work_job",
                "/run",
                {"n": n},
                pool="work",
                slots=rng.randint(1, 3),
                max_retries=rng.randint(0, 2),
                timeout=rng.choice([None, 5.0]),
            )
            for n in range(rng.randint(1, 4))
        ]
        store.enqueue_many(news, now)
    elif what == "claim":
        machine = rng.choice((*MACHINES, LATE))
        store.claim("work_job", rng.randint(1, 4), "test", now, LEASE, machine=machine)
    elif what in ("complete", "fail", "confirm") and (held := running(store)):
        job, attempt, cancelled = rng.choice(held)
        try:
            if what == "complete":
                on = rng.choice((None, *MACHINES))
                store.complete_many([(job, attempt, {"ok": True})], now, machine=on)
            elif what == "fail":
                error: ErrorEntry = {"code": "backend_error", "reason": "boom"}
                store.fail_attempt(job, attempt, error, now, retryable=rng.random() < 0.7)
            elif cancelled:
                store.confirm_cancel(job, attempt, now)
        except (StaleAttempt, Conflict, JobNotFound):
            pass
    elif what == "kill" and (jobs := ids(store, "status IN ('pending', 'processing')")):
        store.kill(rng.choice(jobs), now)
    elif what == "sweep":  # leases and attempts run out: the machine was lost
        store.sweep(now + rng.choice([1.0, 6.0, LEASE + 1]))
    elif what == "retry" and (jobs := ids(store, "status IN ('success', 'failed')")):
        store.retry(rng.choice(jobs), now)
    elif what == "clear":
        store.clear(rng.choice([None, "success", "failed"]))
    elif what == "rollback":  # a poll's transaction undone: its claims and results with it
        try:
            with store.transaction():
                store.claim("work_job", 4, "test", now, LEASE, machine=rng.choice(MACHINES))
                for job, attempt, _ in running(store)[:2]:
                    store.complete_many([(job, attempt, None)], now)
                raise Rollback
        except Rollback:
            pass
    elif what == "late" and LATE not in added:
        store.machines.add(LATE, "work", "test", "r1", 4, now)
        added.add(LATE)
    return what


@pytest.mark.parametrize("seed", range(6))
def test_busy_slots_never_drift_from_the_running_jobs(store: SqlStore, seed: int) -> None:
    rng = random.Random(seed)
    for machine in MACHINES:
        store.machines.add(machine, "work", "test", "r1", 4, T0)
    added: set[str] = set()
    now = T0
    seen = set()
    for n in range(120):
        now += rng.choice([0.5, 2.0, 10.0])
        what = step(store, rng, now, added)
        seen.add(what)
        assert drift(store) == {}, f"after step {n} ({what}) of seed {seed}"
    assert {"claim", "complete", "sweep", "kill"} <= seen


def test_a_machine_added_while_jobs_run_under_its_name_counts_them(store: SqlStore) -> None:
    store.enqueue_many([NewJob("app", "work_job", "/run", {}, pool="work", slots=2)], T0)
    assert store.claim("work_job", 2, "test", T0, LEASE, machine=LATE)
    store.machines.add(LATE, "work", "test", "r1", 4, T0)
    with store.read() as cur:
        cur.execute("SELECT busy_slots FROM machines WHERE name = ?", (LATE,))
        assert cur.fetchone()[0] == 2
    (job, attempt, _), *_ = running(store)
    store.complete(job, attempt, None, T0 + 1)
    assert drift(store) == {}
    with store.read() as cur:
        cur.execute("SELECT busy_slots FROM machines WHERE name = ?", (LATE,))
        assert cur.fetchone()[0] == 0


def test_a_running_job_deleted_frees_its_slots(store: SqlStore) -> None:
    """No path of the store deletes a running job (retention and clear take finished ones);
    a row deleted by hand still leaves the count right."""
    store.machines.add("m1", "work", "test", "r1", 4, T0)
    store.enqueue_many([NewJob("app", "work_job", "/run", {}, pool="work", slots=3)], T0)
    (job,) = store.claim("work_job", 4, "test", T0, LEASE, machine="m1")
    with store.read() as cur:
        cur.execute("SELECT busy_slots FROM machines WHERE name = 'm1'")
        assert cur.fetchone()[0] == 3
    with store.transaction() as cur:
        cur.execute("DELETE FROM jobs WHERE id = ?", (job.id,))
    with store.read() as cur:
        cur.execute("SELECT busy_slots FROM machines WHERE name = 'm1'")
        assert cur.fetchone()[0] == 0
