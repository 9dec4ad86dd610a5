"""The schedules' step of the leader's tick (Jobs docs, "Scheduled and multi-step work").

Each tick the leader, and only it (``reconcile.tick`` returns before this on a follower):

1. brings the schedules' open runs up to their jobs' statuses, and kills the jobs of runs a
   previous leader replaced but died before killing;
2. makes every due fire of every schedule not paused (``policy.schedules.due``: the latest
   fire time not yet made, one catch-up fire after an outage), each one transaction in the
   store keyed by (schedule, fire time), so a fire is made once even when leadership changes
   hands mid-cadence;
3. every prune period, deletes ended runs past their windows (``retention.runSuccess`` /
   ``runFailed``, or the schedule's ``history``), folding them into counters.

A fan-out schedule's fire runs its query read-only and fixes its rows in the store, and every
tick then writes the jobs of the rows still waiting (its own, or what a dead leader left).

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
from typing import Any

from sp00ky_infra.client import check_payload
from sp00ky_infra.config.model import ForEach, Schedule
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.state import Periodic
from sp00ky_infra.policy.schedules import (
    FAN_OUT_BATCH,
    Due,
    FanOutRefused,
    due,
    fan_out_items,
    item_payload,
    resumed_cursor,
)
from sp00ky_infra.store import (
    Conflict,
    InvalidJob,
    JobNotFound,
    NewJob,
    QueueFull,
    StoreError,
)
from sp00ky_infra.store.capacity import CapacityChanging
from sp00ky_infra.store.fan_out import FanOutQueryError, FanOuts, read_only_rows
from sp00ky_infra.store.policies import TablePolicy
from sp00ky_infra.store.schedules import Fired, ScheduleState, ScheduleTable

log = logging.getLogger("sp00ky.controller")


@dataclass
class _Memory:
    """What one controller remembers between ticks: when runs were last pruned, and the
    refusals already logged (a refused fire is tried again every tick until it can be made
    or a later fire time supersedes it; it is logged once)."""

    prune: Periodic
    refused: dict[str, float] = field(default_factory=dict)  # schedule -> fire time
    # fan-outs whose rows wait for room in their pool's queue (logged once, until rows move)
    waiting_for_room: set[str] = field(default_factory=set)


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
        if states[name].paused_at is not None:
            continue  # paused: no fire, and a fan-out's rows not yet written wait
        try:
            if schedule.for_each is not None:
                _fan_out(controller, schedule, states[name], now, memory)
                continue
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
    decision = _due(schedule, state, now)
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


def _due(schedule: Schedule, state: ScheduleState, now: float) -> Due | None:
    cursor = resumed_cursor(state.last_fire_at, state.resumed_at)
    return due(schedule.cadence, cursor, state.first_seen_at, now)


def schedule_pool(controller: Controller, schedule: Schedule) -> str | None:
    backend = controller.config.backends.get(schedule.backend)
    return backend.pool if backend else None


def job_for(controller: Controller, schedule: Schedule, item: str | None = None) -> NewJob:
    """The job a fire of ``schedule`` writes, as ``run`` would write it; for a fan-out's row
    (``item``: its key's value as JSON), with the key in the payload."""
    config = controller.config
    payload = schedule.payload
    if item is not None and schedule.for_each is not None:
        payload = item_payload(payload, schedule.for_each.key, item)
    backend = config.backends.get(schedule.backend)
    if backend is None or backend.method is None or backend.pool is None:
        raise InvalidJob(
            f"backend {schedule.backend!r} has no outbox table or runs on no pool; "
            "`sp00ky-infra lint` says what to fix"
        )
    if backend.spec:
        check_payload(config.resolve(backend.spec), backend.name, schedule.route, payload)
    pool = config.pools.get(backend.pool)
    changing = controller.capacities.get(backend.pool)
    if changing is not None and changing.draining_from is not None:
        raise CapacityChanging(changing.refusal())  # refused with a warning, tried each tick
    max_retries, strategy = (controller.policies.get(backend.method.table) or TablePolicy()).retries
    return NewJob(
        backend=backend.name,
        table=backend.method.table,
        path=schedule.route,
        payload=payload,
        max_retries=max_retries,  # the table's policy, retuned live
        retry_strategy=strategy,
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


# --- fan-out (forEach) -----------------------------------------------------------------------


def _fan_out(
    controller: Controller, schedule: Schedule, state: ScheduleState, now: float, memory: _Memory
) -> None:
    """A fan-out schedule's step: open its due fire (its query's rows, fixed in the store),
    then write the jobs of every row still waiting for one, a batch a transaction, while the
    pool's queue has room (what a dead leader left waiting included)."""
    decision = _due(schedule, state, now)
    if decision is not None and schedule.for_each is not None:
        _open_fan_out(controller, schedule, schedule.for_each, decision.fire_at, now)
    fan_outs = FanOuts(controller.store)
    pool = controller.config.pools.get(schedule_pool(controller, schedule) or "")
    while batch := fan_outs.waiting(schedule.name, FAN_OUT_BATCH):
        done = fan_outs.fire_items(
            schedule.name,
            batch,
            now,
            schedule.concurrency,
            lambda item: job_for(controller, schedule, item),
            max_queued=pool.max_queued if pool else None,
        )
        for job_id in done.replaced_jobs:
            _kill(controller, job_id, now)
        if done.made or done.without_job:
            _report_rows(controller, schedule, len(done.made), done.without_job)
            memory.waiting_for_room.discard(schedule.name)
        if done.full and schedule.name not in memory.waiting_for_room:
            memory.waiting_for_room.add(schedule.name)
            log.warning(
                "schedule=%s fan-out waits for room in pool %s's queue (maxQueued %s)",
                schedule.name,
                pool.name if pool else "-",
                pool.max_queued if pool else "-",
            )
        if done.full or not (done.made or done.without_job):
            return


def _open_fan_out(
    controller: Controller, schedule: Schedule, for_each: ForEach, fire_at: float, now: float
) -> None:
    """Run the query and record the fire's rows; a query that fails, or rows that cannot be
    fanned out, fail the whole fire: a failed run saying why, no job."""
    try:
        columns, rows = read_only_rows(
            controller.store, for_each.query, for_each.max_rows, for_each.timeout
        )
        items = fan_out_items(columns, rows, for_each.key, for_each.max_rows)
        if isinstance(items, FanOutRefused):
            raise FanOutQueryError(items.reason)
        for item in items:  # every row's payload checked before any is fanned out
            job_for(controller, schedule, item)
    except (FanOutQueryError, InvalidJob) as exc:
        run = ScheduleTable(controller.store).fail_fire(schedule.name, fire_at, now, str(exc))
        if run is not None:
            message = f"schedule {schedule.name} fire {utc(fire_at)} failed: {exc}"
            log.warning("%s", message)
            controller.event(_pool_label(controller, schedule), "schedule_failed", message)
        return
    if FanOuts(controller.store).open(schedule.name, fire_at, now, items):
        message = f"schedule {schedule.name} fired {utc(fire_at)}: {len(items)} rows to fan out"
        controller.event(_pool_label(controller, schedule), "schedule_fired", message)


def _report_rows(controller: Controller, schedule: Schedule, made: int, ended: int) -> None:
    backend = controller.config.backends[schedule.backend]
    message = f"schedule {schedule.name} wrote {made} jobs of its fan-out"
    if ended:
        message += f"; {ended} rows ended without one (policy {schedule.concurrency})"
    controller.event(backend.pool or "*", "schedule_fanned_out", message)
    if made and backend.pool is not None:
        controller.wake.pool(backend.pool)


def _pool_label(controller: Controller, schedule: Schedule) -> str:
    return schedule_pool(controller, schedule) or "*"


# --- pausing -----------------------------------------------------------------------------------


def set_paused(controller: Controller, name: str, paused: bool) -> dict[str, Any]:
    """Pause a schedule (it makes no fire until resumed; kept in the store, so no restart or
    deploy un-pauses it) or resume it (the fire times missed meanwhile are not made)."""
    schedule = controller.config.schedules[name]
    state = ScheduleTable(controller.store).set_paused(name, paused, controller.clock())
    verb = "paused" if paused else "resumed"
    controller.event(
        _pool_label(controller, schedule), f"schedule_{verb}", f"schedule {name} {verb}"
    )
    return {
        "name": name,
        "paused": state is not None and state.paused_at is not None,
        "paused_at": state.paused_at if state else None,
        "resumed_at": state.resumed_at if state else None,
    }
