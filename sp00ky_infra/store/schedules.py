"""Schedules in the store: each one's fire cursor, its runs, and the counters of pruned runs.

A fire is one transaction: the run row, keyed by (schedule, fire time), and the job row it
starts are written together, and the schedule's cursor moves to the fire time. A second
controller making the same fire (a leader that lost the lock mid-tick, the one that took
over) finds the cursor already there, or the key taken, and writes nothing: each fire
happens once.

A fan-out's fire (``fan_out.py``) has a run per row, keyed by (schedule, fire time, row key);
a schedule without ``forEach`` keys its runs with the row key ''. A fire whose fan-out
failed is one ``failed`` run with no job, its ``error`` saying why. A schedule's pause is
on its cursor's row (``paused_at``), so no restart or deploy un-pauses it.

A run's status follows its job's (``sync``) until the job ends: pending, processing,
success, failed, or killed (the job was cancelled). ``skipped`` runs (the previous run was
still going, policy skip) have no job; ``replaced`` runs had theirs killed by a later fire
(policy replace). Retention keeps success, skipped and replaced runs for the success window
and failed and killed runs for the failed one, folding each into hourly counters first.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from sp00ky_infra.policy.schedules import ConcurrencyPolicy, FireAction, on_fire
from sp00ky_infra.store.dialect import DEFAULT_BATCH, Dialect, Sql
from sp00ky_infra.store.jobs import check_room
from sp00ky_infra.store.model import CANCELLED, NewJob
from sp00ky_infra.store.retention import Folded, fold_and_delete
from sp00ky_infra.store.rows import INSERT_JOB, insert_row
from sp00ky_infra.store.transitions import new_job_id, validate_new

RunStatus = Literal["pending", "processing", "success", "failed", "killed", "skipped", "replaced"]
RUN_STATUSES: tuple[RunStatus, ...] = (
    "pending",
    "processing",
    "success",
    "failed",
    "killed",
    "skipped",
    "replaced",
)
OPEN: tuple[RunStatus, ...] = ("pending", "processing")
KEPT_AS_SUCCESS: tuple[RunStatus, ...] = ("success", "skipped", "replaced")  # the success window
KEPT_AS_FAILED: tuple[RunStatus, ...] = ("failed", "killed")
FIRED_LATER = "the fire is made when there is room"
RUN_COLUMNS = "id, schedule, fire_at, fired_at, status, job_id, finished_at, item, error"
INSERT_RUN = (
    f"INSERT INTO schedule_runs ({RUN_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (schedule, fire_at, item) DO NOTHING"
)
STATE_COLUMNS = "schedule, first_seen_at, last_fire_at, paused_at, resumed_at"
RUN_ROWS = Folded(
    "schedule_counters", "schedule", "DELETE FROM schedule_runs WHERE id IN ({marks})"
)


@dataclass(frozen=True, slots=True)
class ScheduleState:
    schedule: str
    first_seen_at: float
    last_fire_at: float | None
    paused_at: float | None = None  # paused since (None: not paused)
    resumed_at: float | None = None  # last resumed: the fire times before were not made


@dataclass(frozen=True, slots=True)
class Run:
    id: str
    schedule: str
    fire_at: float
    fired_at: float
    status: RunStatus
    job_id: str | None
    finished_at: float | None
    item: str = ""  # a fan-out's row: its key's value as JSON ('' without forEach)
    error: str | None = None  # why the fire failed (a fan-out's query), for a failed fire

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "schedule": self.schedule,
            "fire_at": self.fire_at,
            "fired_at": self.fired_at,
            "status": self.status,
            "job_id": self.job_id,
            "finished_at": self.finished_at,
            "item": self.item,
            "error": self.error,
        }

    def row(self) -> tuple[Any, ...]:
        """The run as INSERT_RUN writes it."""
        return (
            self.id,
            self.schedule,
            self.fire_at,
            self.fired_at,
            self.status,
            self.job_id,
            self.finished_at,
            self.item,
            self.error,
        )


@dataclass(frozen=True, slots=True)
class Fired:
    """What a fire did: started a job (``fire``), recorded ``skip``, or started a job and
    marked the previous runs ``replaced`` (their jobs, ``replaced_jobs``, are to be killed)."""

    run: Run
    action: FireAction
    replaced_jobs: tuple[str, ...] = ()


def _run(row: Sequence[Any]) -> Run:
    return Run(*row)


def new_run_id() -> str:
    return f"run:{secrets.token_hex(10)}"


def take_fire(sql: Sql, schedule: str, fire_at: float, now: float) -> bool:
    """Move ``schedule``'s cursor to ``fire_at`` inside a write transaction, its key held to
    the end; False (nothing written) when that fire or a later one was made already."""
    sql.lock(f"schedule:{schedule}")
    sql.execute("SELECT last_fire_at FROM schedule_state WHERE schedule = ?", (schedule,))
    row = sql.fetchone()
    if row is not None and row[0] is not None and row[0] >= fire_at:
        return False
    sql.execute(
        "INSERT INTO schedule_state (schedule, first_seen_at, last_fire_at) "
        "VALUES (?, ?, ?) ON CONFLICT (schedule) DO UPDATE SET "
        "last_fire_at = excluded.last_fire_at",
        (schedule, now, fire_at),
    )
    return True


def run_status_of(job_status: str | None, errors: str | None) -> RunStatus:
    """A run's status from its job's: a job that failed because it was killed is ``killed``;
    a job that is gone (cleared before its end was seen) counts as ``failed``."""
    if job_status in ("pending", "processing", "success"):
        return job_status  # type: ignore[return-value]
    if job_status == "failed" and errors:
        entries = json.loads(errors)
        if entries and entries[-1].get("code") == CANCELLED:
            return "killed"
    return "failed"


class ScheduleTable:
    """Schedules' cursors, runs and counters on the store's connections."""

    def __init__(self, db: Dialect) -> None:
        self._db = db

    # --- cursors -------------------------------------------------------------------------

    def states(self, names: Iterable[str], now: float) -> dict[str, ScheduleState]:
        """Each named schedule's cursor; a schedule seen for the first time is recorded as
        first seen at ``now`` (by whichever controller sees it first: they then agree)."""
        wanted = sorted(set(names))
        found = self.read_states(wanted)
        missing = [name for name in wanted if name not in found]
        if missing:
            with self._db.write() as sql:
                for name in missing:
                    sql.execute(
                        "INSERT INTO schedule_state (schedule, first_seen_at) VALUES (?, ?) "
                        "ON CONFLICT (schedule) DO NOTHING",
                        (name, now),
                    )
            found = self.read_states(wanted)
        return found

    def read_states(self, names: Sequence[str]) -> dict[str, ScheduleState]:
        """The cursors of the named schedules the controller has seen (nothing written)."""
        if not names:
            return {}
        marks = ", ".join("?" for _ in names)
        with self._db.read() as sql:
            sql.execute(
                f"SELECT {STATE_COLUMNS} FROM schedule_state WHERE schedule IN ({marks})", names
            )
            return {row[0]: ScheduleState(*row) for row in sql.fetchall()}

    def set_paused(self, schedule: str, paused: bool, now: float) -> ScheduleState | None:
        """Pause ``schedule`` (kept in the store: no restart or deploy un-pauses it; pausing
        again keeps its first pause time) or resume it (the fire times it missed while
        paused are not made); its cursor after, None for a schedule never seen nor paused."""
        with self._db.write() as sql:
            if paused:
                sql.execute(
                    "INSERT INTO schedule_state (schedule, first_seen_at, paused_at) "
                    "VALUES (?, ?, ?) ON CONFLICT (schedule) DO UPDATE SET "
                    "paused_at = COALESCE(schedule_state.paused_at, excluded.paused_at)",
                    (schedule, now, now),
                )
            else:
                sql.execute(
                    "UPDATE schedule_state SET paused_at = NULL, resumed_at = ? "
                    "WHERE schedule = ? AND paused_at IS NOT NULL",
                    (now, schedule),
                )
        return self.read_states([schedule]).get(schedule)

    # --- firing --------------------------------------------------------------------------

    def fire(
        self,
        schedule: str,
        fire_at: float,
        now: float,
        policy: ConcurrencyPolicy,
        new: NewJob,
        max_queued: int | None = None,
    ) -> Fired | None:
        """Make the fire of ``schedule`` for ``fire_at``, as ``policy`` says given its open
        runs; None when that fire (or a later one) was made already. Past the pool's
        ``max_queued`` waiting jobs it raises QueueFull and makes nothing, as ``run`` does (the
        next tick tries again)."""
        validate_new(new)
        with self._db.write() as sql:
            if not take_fire(sql, schedule, fire_at, now):
                return None
            running = self._running(sql, schedule)
            action = on_fire(policy, bool(running))
            job_id = None if action == "skip" else new_job_id(new.table)
            status: RunStatus = "skipped" if action == "skip" else "pending"
            finished = now if action == "skip" else None
            run = Run(new_run_id(), schedule, fire_at, now, status, job_id, finished)
            sql.execute(INSERT_RUN, run.row())
            if sql.rowcount != 1:
                return None
            replaced: tuple[str, ...] = ()
            if job_id is not None:
                if max_queued is not None and new.pool is not None:
                    check_room(sql, new.pool, new.table, 1, max_queued, FIRED_LATER)
                sql.execute(INSERT_JOB, insert_row(new, job_id, now))
                if action == "replace":
                    replaced = tuple(job for _, job in running if job is not None)
                    for open_run, _ in running:
                        sql.execute(
                            "UPDATE schedule_runs SET status = 'replaced', finished_at = ? "
                            "WHERE id = ?",
                            (now, open_run),
                        )
                sql.changed()
        return Fired(run, action, replaced)

    def fail_fire(self, schedule: str, fire_at: float, now: float, error: str) -> Run | None:
        """Make the fire of ``schedule`` for ``fire_at`` a failed run saying why, with no job
        (a fan-out whose query failed); None when that fire was made already."""
        run = Run(new_run_id(), schedule, fire_at, now, "failed", None, now, "", error)
        with self._db.write() as sql:
            if not take_fire(sql, schedule, fire_at, now):
                return None
            sql.execute(INSERT_RUN, run.row())
        return run

    def _running(self, sql: Sql, schedule: str) -> list[tuple[str, str | None]]:
        """(run id, job id) of the schedule's runs whose job is still pending or processing,
        read from the jobs themselves (a run's own status may lag a tick behind)."""
        sql.execute(
            "SELECT r.id, r.job_id FROM schedule_runs r JOIN jobs j ON j.id = r.job_id "
            "WHERE r.schedule = ? AND r.status IN ('pending', 'processing') "
            "AND j.status IN ('pending', 'processing')",
            (schedule,),
        )
        return [(row[0], row[1]) for row in sql.fetchall()]

    # --- following jobs ------------------------------------------------------------------

    def sync(self, now: float) -> list[tuple[str, RunStatus]]:
        """Bring open runs' statuses up to their jobs'; returns (run id, new status) changed."""
        with self._db.read() as sql:
            sql.execute(
                "SELECT r.id, r.status, j.status, j.errors, j.finished_at FROM schedule_runs r "
                "LEFT JOIN jobs j ON j.id = r.job_id WHERE r.status IN ('pending', 'processing') "
                "AND r.job_id IS NOT NULL",  # a fan-out's row waiting for its job has none
            )
            rows = sql.fetchall()
        changes = []
        for run_id, before, job_status, errors, finished_at in rows:
            after = run_status_of(job_status, errors)
            if after != before:
                ended = None if after in OPEN else (finished_at or now)
                changes.append((run_id, before, after, ended))
        if changes:
            with self._db.write() as sql:
                for run_id, before, after, ended in changes:
                    sql.execute(
                        "UPDATE schedule_runs SET status = ?, finished_at = ? "
                        "WHERE id = ? AND status = ?",
                        (after, ended, run_id, before),
                    )
        return [(run_id, after) for run_id, _, after, _ in changes]

    def replaced_still_running(self) -> list[str]:
        """Jobs of replaced runs that still run and were not asked to stop (the controller
        that replaced them died before it killed them)."""
        with self._db.read() as sql:
            sql.execute(
                "SELECT j.id FROM schedule_runs r JOIN jobs j ON j.id = r.job_id "
                "WHERE r.status = 'replaced' AND j.status IN ('pending', 'processing') "
                "AND j.cancel_requested = 0",
            )
            return [row[0] for row in sql.fetchall()]

    # --- retention -----------------------------------------------------------------------

    def prune(
        self,
        now: float,
        windows: Mapping[str, tuple[float, float]],
        default: tuple[float, float],
        batch: int = DEFAULT_BATCH,
    ) -> int:
        """Delete ended runs past their window (``windows[schedule]`` or ``default``:
        (success, failed) seconds), folding each into the hourly counters first. One pass
        per group of statuses over the runs older than the group's shortest window, in
        (finished_at, id) order, whatever the number of schedules."""
        deleted = 0
        for index, statuses in enumerate((KEPT_AS_SUCCESS, KEPT_AS_FAILED)):
            limits = {name: now - pair[index] for name, pair in windows.items()}
            fallback = now - default[index]
            candidates = max([fallback, *limits.values()])  # the shortest window's cutoff
            deleted += self._prune_group(statuses, candidates, limits, fallback, batch)
        return deleted

    def _prune_group(
        self,
        statuses: Sequence[str],
        before: float,
        limits: Mapping[str, float],
        fallback: float,
        batch: int,
    ) -> int:
        marks = ", ".join("?" for _ in statuses)
        removed = 0
        after: tuple[float, str] = (float("-inf"), "")
        while True:
            with self._db.write() as sql:
                sql.execute(
                    "SELECT id, schedule, status, finished_at FROM schedule_runs "
                    f"WHERE status IN ({marks}) AND finished_at < ? "
                    "AND (finished_at > ? OR (finished_at = ? AND id > ?)) "
                    "ORDER BY finished_at, id LIMIT ?",
                    (*statuses, before, after[0], after[0], after[1], batch),
                )
                rows = sql.fetchall()
                doomed = [row for row in rows if row[3] < limits.get(row[1], fallback)]
                fold_and_delete(sql, RUN_ROWS, doomed)
            removed += len(doomed)
            if len(rows) < batch:
                return removed
            after = (rows[-1][3], rows[-1][0])

    # --- reading -------------------------------------------------------------------------

    def runs(self, schedule: str, limit: int = 20) -> list[Run]:
        """The schedule's runs, the latest fire first."""
        with self._db.read() as sql:
            sql.execute(
                f"SELECT {RUN_COLUMNS} FROM schedule_runs WHERE schedule = ? "
                "ORDER BY fire_at DESC, item LIMIT ?",
                (schedule, limit),
            )
            return [_run(row) for row in sql.fetchall()]

    def totals(self, schedule: str) -> dict[str, dict[str, int]]:
        """The schedule's runs by status: those still kept (``kept``) and those retention
        folded into the counters (``pruned``); every status present in both."""
        with self._db.read() as sql:
            sql.execute(
                "SELECT status, count(*) FROM schedule_runs WHERE schedule = ? GROUP BY status",
                (schedule,),
            )
            kept = {row[0]: int(row[1]) for row in sql.fetchall()}
            sql.execute(
                "SELECT outcome, sum(count) FROM schedule_counters WHERE schedule = ? "
                "GROUP BY outcome",
                (schedule,),
            )
            pruned = {row[0]: int(row[1]) for row in sql.fetchall()}
        return {
            "kept": {status: kept.get(status, 0) for status in RUN_STATUSES},
            "pruned": {status: pruned.get(status, 0) for status in RUN_STATUSES},
        }
