"""What ``schedules list|get`` and the admin API's ``GET /schedules`` show of each schedule:
its settings from sp00ky.yml and its state, next fire time and totals from the store."""

from __future__ import annotations

from typing import Any

from sp00ky_infra.config import Config
from sp00ky_infra.config.model import Schedule
from sp00ky_infra.policy.schedules import next_fire, resumed_cursor
from sp00ky_infra.store.dialect import Dialect
from sp00ky_infra.store.schedules import ScheduleState, ScheduleTable


def describe(
    schedule: Schedule, state: ScheduleState | None, table: ScheduleTable, now: float
) -> dict[str, Any]:
    """One schedule as ``--json`` prints it. A schedule no controller has seen yet would fire
    first at its next fire time after the controller sees it: shown as if that were now."""
    if state is None:
        upcoming = next_fire(schedule.cadence, None, now)
    elif state.paused_at is not None:
        upcoming = None  # none until resumed
    else:
        cursor = resumed_cursor(state.last_fire_at, state.resumed_at)
        upcoming = next_fire(schedule.cadence, cursor, state.first_seen_at)
        if upcoming is not None and upcoming < now:  # overdue: the next tick makes it
            upcoming = now
    for_each = schedule.for_each
    return {
        "name": schedule.name,
        "cadence": schedule.cadence_text,
        "backend": schedule.backend,
        "route": schedule.route,
        "payload": schedule.payload,
        "concurrency": schedule.concurrency,
        "for_each": (
            {"query": for_each.query, "key": for_each.key, "max_rows": for_each.max_rows}
            if for_each
            else None
        ),
        "paused": state is not None and state.paused_at is not None,
        "paused_at": state.paused_at if state else None,
        "seen": state is not None,
        "first_seen_at": state.first_seen_at if state else None,
        "last_fire_at": state.last_fire_at if state else None,
        "next_fire_at": upcoming,
        "totals": table.totals(schedule.name),
    }


def schedule_views(
    config: Config, store: Dialect, names: list[str], now: float
) -> list[dict[str, Any]]:
    """Each named schedule as ``describe`` gives it."""
    table = ScheduleTable(store)
    states = table.read_states(names)
    return [describe(config.schedules[name], states.get(name), table, now) for name in names]


def schedule_view(
    config: Config, store: Dialect, name: str, now: float, runs: int
) -> dict[str, Any]:
    """One schedule with its ``runs`` most recent runs (``schedules get``)."""
    [found] = schedule_views(config, store, [name], now)
    found["runs"] = [run.as_json() for run in ScheduleTable(store).runs(name, runs)]
    return found
