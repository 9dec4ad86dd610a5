"""``sp00ky-infra pools list|get|pause|resume|reset|drain|cancel``: a client of the admin API.

The API is found at ``--admin-url`` / $SPKY_ADMIN_URL, else where the project's controller
wrote it (``.sp00ky/controller.json`` next to sp00ky.yml: ``--config`` / $SPKY_CONFIG /
./sp00ky.yml), else http://127.0.0.1:9670; the token is $SPKY_ADMIN_TOKEN, else that state
directory's ``admin-token``.
"""

from __future__ import annotations

import io
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from sp00ky_infra.cli.cloud import (
    AdminError,
    cloud_call,
    cloud_everywhere,
    in_cloud,
    request,
)
from sp00ky_infra.cli.dashboard import Column, print_listing, when
from sp00ky_infra.cli.jobs import config_option, json_option
from sp00ky_infra.config.project import state_dir
from sp00ky_infra.controller.settings import DEFAULT_ADMIN_PORT


@dataclass(frozen=True, slots=True)
class Where:
    """Where the admin API is: an explicit URL, and the sp00ky.yml whose state says more."""

    admin_url: str | None = None
    config_file: str | None = None


def _admin(where: Where = Where()) -> tuple[str, str]:
    directory = state_dir(where.config_file or None)
    url = where.admin_url or os.environ.get("SPKY_ADMIN_URL", "")
    if not url:
        try:
            url = json.loads((directory / "controller.json").read_text())["admin_url"]
        except (OSError, ValueError, KeyError):
            url = f"http://127.0.0.1:{DEFAULT_ADMIN_PORT}"
    token = os.environ.get("SPKY_ADMIN_TOKEN", "")
    if not token:
        try:
            token = (directory / "admin-token").read_text().strip()
        except OSError:
            token = ""
    return url.rstrip("/"), token


def admin_request(method: str, path: str, where: Where = Where()) -> Any:
    """One admin API call: its JSON answer, or AdminError."""
    return request(*_admin(where), method, path)


def call(method: str, path: str) -> Any:
    """``admin_request`` for the command line (with --cloud: ``cloud_call``): a refusal is
    printed, and exits 1."""
    if in_cloud():
        return cloud_call(method, path)
    context = click.get_current_context(silent=True)
    where = context.find_object(Where) if context is not None else None
    try:
        return admin_request(method, path, where or Where())
    except AdminError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@click.group()
@click.option(
    "--admin-url",
    envvar="SPKY_ADMIN_URL",
    help="The admin API (default: $SPKY_ADMIN_URL, else the one the project's controller "
    "wrote next to sp00ky.yml, else http://127.0.0.1:9670).",
)
@config_option
@click.pass_context
def pools(ctx: click.Context, admin_url: str | None, config_file: str | None) -> None:
    """Machine pools: capacity, machines, queue, breaker; pause, resume, reset, drain, cancel."""
    ctx.obj = Where(admin_url or None, config_file or None)


# Headers short enough for 80 columns; the machines by state wrap, nothing else is cut.
LIST_COLUMNS = (
    Column("pool"),
    Column("want", "right"),
    Column("machines", wraps=True),
    *(Column(header, "right") for header in ("queue", "run")),
    *(Column(header) for header in ("breaker", "paused")),
    *(Column(header, "right") for header in ("hours", "EUR")),
)


@pools.command("list")
@json_option
def list_(as_json: bool) -> None:
    """Every pool with its machines by state, queue and breaker."""
    found = call("GET", "/pools")
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    rows = [
        (
            pool["name"],
            str(pool["desired"]),
            ", ".join(f"{n} {state}" for state, n in sorted(pool["machines"].items())) or "-",
            str(pool["queue"]["queued"]),
            str(pool["queue"]["running"]),
            "open" if pool["breaker"]["open"] else "closed",
            "yes" if pool["paused"] else "no",
            f"{pool['pool_machine_hours']:.3f}",
            _euros(pool["cost"]["euros"]),
        )
        for pool in found
    ]
    print_listing(LIST_COLUMNS, rows)


def provider_phrase(found: dict[str, Any]) -> str:
    """A pool's provider as served, ``hetzner``, and as declared when that differs: ``local
    (hetzner in sp00ky.yml)``."""
    declared = found.get("declared_provider")
    served = str(found["provider"])
    return served if declared in (None, served) else f"{served} ({declared} in sp00ky.yml)"


@pools.command()
@click.argument("name")
@json_option
def get(name: str, as_json: bool) -> None:
    """One pool in full, with its machines and open incidents."""
    pool = call("GET", f"/pools/{name}")
    if as_json:
        click.echo(json.dumps(pool, indent=2))
        return
    click.echo(
        f"{pool['name']}: backend {pool['backend']} on {provider_phrase(pool)}; "
        f"desired {pool['desired']} (min {pool['min']}, max {pool['max']}, "
        f"{'autoscale' if pool['autoscale'] else 'fixed'}, {pool['slots']} slot(s)); "
        f"queued {pool['queue']['queued']}, running {pool['queue']['running']}; "
        f"breaker {'open' if pool['breaker']['open'] else 'closed'}"
        + ("; PAUSED" if pool["paused"] else "")
    )
    if pool["breaker"]["open"]:
        click.echo(
            f"  breaker: {_breaker_words(pool['breaker'])}; once the backend is fixed, "
            f"`sp00ky-infra pools reset {pool['name']}` closes it"
        )
    change = pool.get("capacity_change")
    if change:
        click.echo(
            f"  capacity: lowering from {change['draining_from']} to {change['slots']} slots "
            f"since {when(change['changed_at'])}: the jobs queued before it drain first; new "
            "jobs are refused until they have"
        )
    click.echo("  " + _cost_line(pool["cost"]))
    snapshots = _snapshots_line(pool["cost"])
    if snapshots:
        click.echo("  " + snapshots)
    for machine in pool["machine_list"]:
        click.echo(
            f"  {machine['name']:<20} {machine['state']:<9} busy {machine['busy_slots']}"
            + (f"  ({machine['drain_reason']})" if machine.get("drain_reason") else "")
            + ("  on an old agent" if machine.get("agent_current") is False else "")
        )
    for incident in pool["incidents"]:
        click.echo(f"  incident {incident['kind']}: {incident['message']}")
    waiting = pool.get("waiting", [])
    click.echo(
        f"  waiting, in admission order ({len(waiting)} shown of {pool['queue']['pending']}; "
        f"cancel one with `sp00ky-infra pools cancel {pool['name']} KEY`):"
        if waiting
        else "  waiting: none"
    )
    if waiting:
        click.echo(_entries(waiting, ("key", "priority", "slots", "due", "queue deadline")))
    recent = pool.get("recent", [])
    if recent:
        click.echo("  recent terminal entries, last finished first:")
        click.echo(_entries(recent, ("key", "status", "code", "slots", "finished")))


def _entries(entries: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    """Entries as an indented table, one per line (wide enough for ids: never wrapped)."""
    table = Table(show_edge=False, box=None, padding=(0, 2, 0, 0))
    for column in columns:
        table.add_column(column, no_wrap=True)
    cells: dict[str, Callable[[dict[str, Any]], str]] = {
        "key": lambda e: str(e["key"]),
        "priority": lambda e: str(e["priority"]),
        "slots": lambda e: str(e["slots"]),
        "status": lambda e: str(e["status"]),
        "code": lambda e: str(e.get("code") or "-"),
        "due": lambda e: when(e["due_at"]),
        "queue deadline": lambda e: when(e["queue_deadline"]),
        "finished": lambda e: when(e["finished_at"]),
    }
    for entry in entries:
        table.add_row(*(cells[column](entry) for column in columns))
    console = Console(width=200, file=io.StringIO(), color_system=None)
    console.print(table)
    output = console.file.getvalue()  # type: ignore[attr-defined]
    return "\n".join("    " + line.rstrip() for line in output.splitlines() if line.strip())


@pools.command()
@click.argument("name")
@click.argument("key")
@json_option
def cancel(name: str, key: str, as_json: bool) -> None:
    """Cancel the waiting entry KEY of pool NAME (its job fails with code cancelled)."""
    job = call("POST", f"/pools/{name}/queue/{key}/cancel")
    if as_json:
        click.echo(json.dumps(job, indent=2))
        return
    click.echo(f"{key}: cancelled (failed with code cancelled)")


@pools.command()
@click.argument("name")
def pause(name: str) -> None:
    """Create and bind nothing new in pool NAME (running jobs finish). A deploy never un-pauses."""
    call("POST", f"/pools/{name}/pause")
    click.echo(f"{name}: paused")


@pools.command()
@click.argument("name")
def resume(name: str) -> None:
    """Undo pause (an open breaker stays open: `pools reset` closes it)."""
    pool = call("POST", f"/pools/{name}/resume")
    breaker = pool["breaker"]
    if not breaker["open"]:
        click.echo(f"{name}: resumed")
        return
    click.echo(
        f"{name}: resumed, but its breaker holds it, not a pause: "
        f"{_breaker_words(breaker)}; once the backend is fixed, run "
        f"`sp00ky-infra pools reset {name}`"
    )


@pools.command()
@click.argument("name")
def reset(name: str) -> None:
    """Close pool NAME's breaker after fixing what failed its boots: new machines at once."""
    pool = call("POST", f"/pools/{name}/reset")
    before = pool["breaker_before"]
    if before["open"]:
        click.echo(f"{name}: breaker closed (it was open: {_breaker_words(before)})")
    elif before["failures"]:
        click.echo(f"{name}: breaker closed; its {before['failures']} failed boot(s) forgotten")
    else:
        click.echo(f"{name}: breaker closed (it was closed already)")
    if pool["paused"]:
        click.echo(f"{name}: still paused: `sp00ky-infra pools resume {name}` undoes it")


def _breaker_words(breaker: dict[str, Any]) -> str:
    return (
        f"{breaker['failures']} failed boot(s) in a row, no new machine until "
        f"{when(breaker['open_until'])} UTC"
    )


@pools.command()
@click.argument("machine")
def drain(machine: str) -> None:
    """Drain MACHINE by hand: it takes no new job, finishes its jobs, and is destroyed."""
    call("POST", f"/machines/{machine}/drain")
    click.echo(f"{machine}: draining")


def _euros(amount: float | None) -> str:
    return "unknown" if amount is None else f"{amount:.4f}"


def _cost_line(cost: dict[str, Any]) -> str:
    """The cost line of ``pools get``: never 0 EUR for a type with no known price."""
    hours = f"{cost['machine_hours']:.3f} machine-hours ({cost['machines']} machine(s))"
    price = cost["price"]
    if price is None:
        return f"cost: unknown over {hours}; {cost['price_unknown']}"
    per_job = cost["euros_per_job"]
    return (
        f"cost: {cost['euros']:.4f} EUR over {hours}, {cost['idle_euros']:.4f} EUR idle, "
        + (f"{per_job:.6f} EUR per job ({cost['jobs']})" if per_job is not None else "no job yet")
        + f"; {cost['server_type']} at {price['hourly']:g} EUR/h, capped at "
        f"{price['monthly']:g} EUR/month ({price['source']})"
    )


def _snapshots_line(cost: dict[str, Any]) -> str:
    """The snapshots line of ``pools get``: what the pool's snapshots cost, and the machines
    and snapshots together; nothing for a pool with none (or never listed)."""
    shown = cost.get("snapshots")
    if not shown or not shown["count"]:
        return ""
    together = cost["total_euros"]
    return (
        f"snapshots: {shown['count']}, {shown['gigabytes']:.2f} GB, "
        f"{shown['monthly_euros']:.4f} EUR a month (read {shown['read_on']}); "
        f"{shown['euros']:.4f} EUR so far, machines and snapshots together "
        + ("unknown (the machines' euros are)" if together is None else f"{together:.4f} EUR")
    )


cloud_everywhere(pools)
