"""``sp00ky-infra schedules [list|get NAME]``: the schedules of sp00ky.yml, their next fire
times (UTC) and their runs' totals, read from the config and the store (nothing written)."""

from __future__ import annotations

import difflib
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from sp00ky_infra.cli.jobs import config_option, json_option, opened, refusals, store_option
from sp00ky_infra.config import Config
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.config.model import Schedule
from sp00ky_infra.policy.schedules import next_fire
from sp00ky_infra.store import SqlStore
from sp00ky_infra.store.schedules import ScheduleState, ScheduleTable

RECENT_RUNS = 10


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


def describe(
    schedule: Schedule, state: ScheduleState | None, table: ScheduleTable, now: float
) -> dict[str, Any]:
    """One schedule as ``--json`` prints it. A schedule no controller has seen yet would fire
    first at its next fire time after the controller sees it: shown as if that were now."""
    if state is None:
        upcoming = next_fire(schedule.cadence, None, now)
    else:
        upcoming = next_fire(schedule.cadence, state.last_fire_at, state.first_seen_at)
        if upcoming is not None and upcoming < now:  # overdue: the next tick makes it
            upcoming = now
    return {
        "name": schedule.name,
        "cadence": schedule.cadence_text,
        "backend": schedule.backend,
        "route": schedule.route,
        "payload": schedule.payload,
        "concurrency": schedule.concurrency,
        "seen": state is not None,
        "first_seen_at": state.first_seen_at if state else None,
        "last_fire_at": state.last_fire_at if state else None,
        "next_fire_at": upcoming,
        "totals": table.totals(schedule.name),
    }


def _load(config_file: str | None) -> Config:
    with refusals():
        return load_config(config_file)


def _described(config: Config, store: SqlStore, names: list[str]) -> list[dict[str, Any]]:
    table = ScheduleTable(store)
    with refusals():
        states = table.read_states(names)
        now = time.time()
        return [describe(config.schedules[name], states.get(name), table, now) for name in names]


def _counts(totals: dict[str, int], *statuses: str) -> str:
    return "  ".join(f"{totals[status]} {status}" for status in statuses if totals[status]) or "-"


@click.group(invoke_without_command=True)
@click.pass_context
def schedules(ctx: click.Context) -> None:
    """Schedules (sp00ky.yml's `schedules:`): next fire times, runs and totals."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_schedules)


@schedules.command("list")
@config_option
@store_option
@json_option
def list_schedules(
    config_file: str | None = None, store_url: str | None = None, as_json: bool = False
) -> None:
    """Every schedule with its cadence, next fire time (UTC) and run totals."""
    config = _load(config_file)
    with opened(store_url) as store:
        rows = _described(config, store, sorted(config.schedules))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no schedules in sp00ky.yml")
        return
    table = Table("schedule", "cadence", "job", "policy", "next fire (UTC)", "last fire", "runs")
    for row in rows:
        kept, pruned = row["totals"]["kept"], row["totals"]["pruned"]
        every = {status: kept[status] + pruned[status] for status in kept}
        table.add_row(
            row["name"],
            row["cadence"],
            f"{row['backend']} {row['route']}",
            row["concurrency"],
            _when(row["next_fire_at"]),
            _when(row["last_fire_at"]),
            _counts(
                every, "pending", "processing", "success", "failed", "killed", "skipped", "replaced"
            ),
        )
    Console().print(table)


@schedules.command("get")
@click.argument("name")
@config_option
@store_option
@json_option
def get_schedule(
    name: str, config_file: str | None = None, store_url: str | None = None, as_json: bool = False
) -> None:
    """One schedule: its settings, next fire time, recent runs and totals (pruned included)."""
    config = _load(config_file)
    if name not in config.schedules:
        close = difflib.get_close_matches(name, list(config.schedules), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        known = ", ".join(sorted(config.schedules)) or "none"
        click.echo(
            f"error: no schedule {name!r} in sp00ky.yml (schedules: {known}){hint}", err=True
        )
        sys.exit(1)
    with opened(store_url) as store:
        [row] = _described(config, store, [name])
        with refusals():
            runs = ScheduleTable(store).runs(name, RECENT_RUNS)
    row["runs"] = [run.as_json() for run in runs]
    if as_json:
        click.echo(json.dumps(row, indent=2))
        return
    kept, pruned = row["totals"]["kept"], row["totals"]["pruned"]
    lines = [
        ("schedule", row["name"]),
        ("cadence", f"{row['cadence']} (UTC)"),
        ("job", f"{row['backend']} {row['route']} {json.dumps(row['payload'])}"),
        ("concurrency", row["concurrency"]),
        ("next fire", _when(row["next_fire_at"])),
        (
            "last fire",
            _when(row["last_fire_at"]) if row["seen"] else "- (no controller has seen it yet)",
        ),
        ("kept", _counts(kept, *kept)),
        (
            "pruned",
            f"{pruned['success']} ok  {pruned['failed'] + pruned['killed']} failed  "
            f"{pruned['skipped']} skipped  {pruned['replaced']} replaced",
        ),
    ]
    for label, value in lines:
        click.echo(f"  {label:<12}: {value}")
    if runs:
        table = Table("fire time (UTC)", "status", "job", "ended")
        for run in runs:
            table.add_row(_when(run.fire_at), run.status, run.job_id or "-", _when(run.finished_at))
        Console().print(table)
