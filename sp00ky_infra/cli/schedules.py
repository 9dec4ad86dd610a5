"""``sp00ky-infra schedules [list|get NAME|pause NAME|resume NAME]``: the schedules of
sp00ky.yml, their next fire times (UTC) and their runs' totals, read from the config and the
store; ``pause`` and ``resume`` write the schedule's pause into the store, where every
controller of it reads it at its next tick (no restart or deploy un-pauses a schedule)."""

from __future__ import annotations

import difflib
import json
import sys
import time
from datetime import UTC, datetime
from typing import Any

import click

from sp00ky_infra.cli.cloud import cloud_call, cloud_everywhere, in_cloud, part
from sp00ky_infra.cli.dashboard import Column, print_listing
from sp00ky_infra.cli.jobs import config_option, json_option, opened, refusals, store_option
from sp00ky_infra.config import Config
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.store.schedule_views import schedule_view, schedule_views
from sp00ky_infra.store.schedules import ScheduleTable

RECENT_RUNS = 10
RUN_STATUSES = ("pending", "processing", "success", "failed", "killed", "skipped", "replaced")
# Names, cadences and ids show whole; times, the job and the counts wrap word by word.
LIST_COLUMNS = (
    Column("schedule"),
    Column("cadence"),
    Column("job", wraps=True),
    Column("policy"),
    Column("next fire (UTC)", wraps=True),
    Column("last fire", wraps=True),
    Column("runs", wraps=True),
)
RUN_COLUMNS = (
    Column("fire time (UTC)", wraps=True),
    Column("row"),
    Column("status"),
    Column("job"),
    Column("ended", wraps=True),
    Column("error", wraps=True),
)


def _when(at: float | None) -> str:
    if at is None:
        return "-"
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _load(config_file: str | None) -> Config:
    with refusals():
        return load_config(config_file)


def _counts(totals: dict[str, int], *statuses: str) -> str:
    return "  ".join(f"{totals[status]} {status}" for status in statuses if totals[status]) or "-"


@click.group(invoke_without_command=True)
@click.pass_context
def schedules(ctx: click.Context) -> None:
    """Schedules (sp00ky.yml's `schedules:`): next fire times, runs and totals; pause, resume."""
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
    if in_cloud():
        rows_found: list[dict[str, Any]] = cloud_call("GET", "/schedules")
    else:
        config = _load(config_file)
        with opened(store_url) as store, refusals():
            rows_found = schedule_views(config, store, sorted(config.schedules), time.time())
    if as_json:
        click.echo(json.dumps(rows_found, indent=2))
        return
    if not rows_found:
        click.echo("no schedules in sp00ky.yml")
        return
    rows = []
    for row in rows_found:
        kept, pruned = row["totals"]["kept"], row["totals"]["pruned"]
        every = {status: kept[status] + pruned[status] for status in kept}
        rows.append(
            (
                row["name"],
                row["cadence"],
                f"{row['backend']} {row['route']}",
                row["concurrency"],
                f"paused since {_when(row['paused_at'])}"
                if row["paused"]
                else _when(row["next_fire_at"]),
                _when(row["last_fire_at"]),
                _counts(every, *RUN_STATUSES),
            )
        )
    print_listing(LIST_COLUMNS, rows, ("last fire", "policy", "job"))


@schedules.command("get")
@click.argument("name")
@config_option
@store_option
@json_option
def get_schedule(
    name: str, config_file: str | None = None, store_url: str | None = None, as_json: bool = False
) -> None:
    """One schedule: its settings, next fire time, recent runs and totals (pruned included)."""
    if in_cloud():
        row = cloud_call("GET", f"/schedules/{part(name)}?runs={RECENT_RUNS}")
    else:
        config = _load(config_file)
        _named(config, name)
        with opened(store_url) as store, refusals():
            row = schedule_view(config, store, name, time.time(), RECENT_RUNS)
    runs = row["runs"]
    if as_json:
        click.echo(json.dumps(row, indent=2))
        return
    kept, pruned = row["totals"]["kept"], row["totals"]["pruned"]
    lines = [
        ("schedule", row["name"]),
        ("cadence", f"{row['cadence']} (UTC)"),
        ("job", f"{row['backend']} {row['route']} {json.dumps(row['payload'])}"),
        ("concurrency", row["concurrency"]),
        *_fan_out_lines(row),
        ("paused", f"since {_when(row['paused_at'])} UTC" if row["paused"] else "no"),
        ("next fire", _when(row["next_fire_at"]) if not row["paused"] else "- (paused)"),
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
        rows = [
            (
                _when(run["fire_at"]),
                run["item"] or "-",
                run["status"],
                run["job_id"] or "-",
                _when(run["finished_at"]),
                run["error"] or "",
            )
            for run in runs
        ]
        print_listing(RUN_COLUMNS, rows, ("ended",))


def _fan_out_lines(row: dict[str, Any]) -> list[tuple[str, str]]:
    for_each = row["for_each"]
    if for_each is None:
        return []
    return [("for each", f"{for_each['query']}  (key {for_each['key']})")]


def _named(config: Config, name: str) -> None:
    """Exit saying which schedules exist when ``name`` is not one of them."""
    if name in config.schedules:
        return
    close = difflib.get_close_matches(name, list(config.schedules), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    known = ", ".join(sorted(config.schedules)) or "none"
    click.echo(f"error: no schedule {name!r} in sp00ky.yml (schedules: {known}){hint}", err=True)
    sys.exit(1)


def _set_paused(name: str, paused: bool, config_file: str | None, store_url: str | None) -> None:
    if in_cloud():
        found = cloud_call("POST", f"/schedules/{part(name)}/{'pause' if paused else 'resume'}")
        paused_at = found.get("paused_at")
    else:
        config = _load(config_file)
        _named(config, name)
        with opened(store_url) as store, refusals():
            state = ScheduleTable(store).set_paused(name, paused, time.time())
        paused_at = state.paused_at if state is not None else None
    if paused and paused_at is not None:
        click.echo(f"schedule {name} paused since {_when(paused_at)} UTC")
    else:
        click.echo(f"schedule {name} resumed: its next fire is its next fire time from now")


@schedules.command("pause")
@click.argument("name")
@config_option
@store_option
def pause_schedule(name: str, config_file: str | None = None, store_url: str | None = None) -> None:
    """Pause a schedule: it makes no fire until resumed (no restart or deploy resumes it)."""
    _set_paused(name, True, config_file, store_url)


@schedules.command("resume")
@click.argument("name")
@config_option
@store_option
def resume_schedule(
    name: str, config_file: str | None = None, store_url: str | None = None
) -> None:
    """Resume a paused schedule; the fire times it missed while paused are not made."""
    _set_paused(name, False, config_file, store_url)


cloud_everywhere(schedules)
