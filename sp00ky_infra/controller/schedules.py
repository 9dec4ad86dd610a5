"""The schedules' step of the leader's tick (Jobs docs, "Scheduled and multi-step work").

Each tick the leader, and only it (``reconcile.tick`` returns before this on a follower):

1. brings the schedules' open runs up to their jobs' statuses, and kills the jobs of runs a
   previous leader replaced but died before killing;
2. makes every due fire (``policy.schedules.due``: the latest fire time not yet made, one
   catch-up fire after an outage), each one transaction in the store keyed by (schedule,
   fire time), so a fire is made once even when leadership changes hands mid-cadence;
3. every prune period, deletes ended runs past their windows (``retention.runSuccess`` /
   ``runFailed``, or the schedule's ``history``), folding them into counters.

A fire's job is the row ``run`` would write: the backend's outbox table, the schedule's route
and payload (checked against the backend's spec first), the pool's queue timeout and
maxJobDuration.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sp00ky_infra.client import check_payload
from sp00ky_infra.config.model import Schedule
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.state import Periodic
from sp00ky_infra.policy.schedules import due
from sp00ky_infra.store import (
    Conflict,
    InvalidJob,
    JobNotFound,
    NewJob,
    QueueFull,
    StoreError,
)
from sp00ky_infra.store.schedules import Fired, ScheduleState, ScheduleTable

log = logging.getLogger("sp00ky.controller")


@dataclass
class _Memory:
    """What one controller remembers between ticks: when runs were last pruned, and the
    refusals already logged (a refused fire is tried again every tick until it can be made
    or a later fire time supersedes it; it is logged once)."""

    prune: Periodic
    refused: dict[str, float] = field(default_factory=dict)  # schedule -> fire time


_memories: weakref.WeakKeyDictionary[Controller, _Memory] = weakref.WeakKeyDictionary()


def _memory(controller: Controller) -> _Memory:
    memory = _memories.get(controller)
    if memory is None:
        memory = _memories[controller] = _Memory(Periodic(controller.settings.prune_every))
    return memory


def utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fire_schedules(controller: Controller, now: float) -> list[str]:
    """The schedules' step of one leader tick; returns what failed (each schedule isolated)."""
    table = ScheduleTable(controller.store)
    memory = _memory(controller)
    errors: list[str] = []
    try:
        table.sync(now)
        for job_id in table.replaced_still_running():
            _kill(controller, job_id, now)
        schedules = controller.config.schedules
        states = table.states(schedules, now) if schedules else {}
    except StoreError as exc:
        log.warning("schedules: cannot read their runs: %s", exc)
        return [f"schedules: {exc}"]
    for name, schedule in schedules.items():
        try:
            fired = _fire_if_due(controller, table, schedule, states[name], now, memory)
        except (InvalidJob, QueueFull) as exc:  # logged once per fire time by _fire_if_due
            errors.append(f"schedule {name}: {exc}")
            continue
        except StoreError as exc:  # the next tick tries the same fire again
            log.warning("schedule=%s cannot fire: %s", name, exc)
            errors.append(f"schedule {name}: {exc}")
            continue
        if fired is not None:
            _report(controller, schedule, fired, now)
    if memory.prune.due(now):
        try:
            _prune(controller, table, now)
        except StoreError as exc:
            log.warning("schedules' retention failed: %s", exc)
            errors.append(f"schedules' retention: {exc}")
    return errors


def _fire_if_due(
    controller: Controller,
    table: ScheduleTable,
    schedule: Schedule,
    state: ScheduleState,
    now: float,
    memory: _Memory,
) -> Fired | None:
    decision = due(schedule.cadence, state.last_fire_at, state.first_seen_at, now)
    if decision is None:
        return None
    pool = controller.config.pools.get(schedule_pool(controller, schedule) or "")
    try:
        new = job_for(controller, schedule)
        fired = table.fire(
            schedule.name,
            decision.fire_at,
            now,
            schedule.concurrency,
            new,
            max_queued=pool.max_queued if pool else None,
        )
    except (InvalidJob, QueueFull) as exc:
        if memory.refused.get(schedule.name) != decision.fire_at:
            memory.refused[schedule.name] = decision.fire_at
            log.warning(
                "schedule=%s fire=%s refused (tried again every tick): %s",
                schedule.name,
                utc(decision.fire_at),
                exc,
            )
        raise
    if fired is not None and decision.missed_since is not None:
        log.warning(
            "schedule=%s missed the fire times from %s until %s (the controller was down or "
            "had no leader); one catch-up fire for %s",
            schedule.name,
            utc(decision.missed_since),
            utc(decision.fire_at),
            utc(decision.fire_at),
        )
    return fired


def schedule_pool(controller: Controller, schedule: Schedule) -> str | None:
    backend = controller.config.backends.get(schedule.backend)
    return backend.pool if backend else None


def job_for(controller: Controller, schedule: Schedule) -> NewJob:
    """The job a fire of ``schedule`` writes, as ``run`` would write it."""
    config = controller.config
    backend = config.backends.get(schedule.backend)
    if backend is None or backend.method is None or backend.pool is None:
        raise InvalidJob(
            f"backend {schedule.backend!r} has no outbox table or runs on no pool; "
            "`sp00ky-infra lint` says what to fix"
        )
    if backend.spec:
        check_payload(config.resolve(backend.spec), backend.name, schedule.route, schedule.payload)
    pool = config.pools.get(backend.pool)
    return NewJob(
        backend=backend.name,
        table=backend.method.table,
        path=schedule.route,
        payload=schedule.payload,
        pool=backend.pool,
        queue_timeout=pool.queue_timeout if pool else None,
        max_job_duration=pool.max_job_duration if pool else None,
    )


def _report(controller: Controller, schedule: Schedule, fired: Fired, now: float) -> None:
    backend = controller.config.backends[schedule.backend]
    pool = backend.pool or "*"
    run = fired.run
    if fired.action == "skip":
        message = f"schedule {schedule.name} skipped {utc(run.fire_at)}: its previous run is going"
        controller.event(pool, "schedule_skipped", message)
        return
    for job_id in fired.replaced_jobs:
        _kill(controller, job_id, now)
    replaced = f", replacing {', '.join(fired.replaced_jobs)}" if fired.replaced_jobs else ""
    message = f"schedule {schedule.name} fired {utc(run.fire_at)}: job {run.job_id}{replaced}"
    controller.event(pool, "schedule_fired", message)
    if backend.pool is not None:
        controller.wake.pool(backend.pool)


def _kill(controller: Controller, job_id: str, now: float) -> None:
    with contextlib.suppress(Conflict, JobNotFound):  # it ended meanwhile: nothing to replace
        controller.store.kill(job_id, now)


def _prune(controller: Controller, table: ScheduleTable, now: float) -> int:
    retention = controller.config.retention
    default = (retention.run_success, retention.run_failed)
    windows = {
        name: (
            schedule.history_success or retention.run_success,
            schedule.history_failed or retention.run_failed,
        )
        for name, schedule in controller.config.schedules.items()
    }
    return table.prune(now, windows, default)
