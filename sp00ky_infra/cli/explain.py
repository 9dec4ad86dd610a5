"""``sp00ky-infra explain JOB_ID`` and ``explain pool NAME``: why a job still waits, why a pool
has the machines it has. A client of the admin API (found as ``pools`` finds it); the
reasoning is the controller's (policy/explain.py over the tick's own plan)."""

from __future__ import annotations

import datetime
import json
from typing import Any
from urllib.parse import quote

import click

from sp00ky_infra.cli.cloud import cloud_option
from sp00ky_infra.cli.jobs import json_option
from sp00ky_infra.cli.pools import call, provider_phrase


@click.command()
@click.argument("target", nargs=-1, required=True)
@json_option
@cloud_option
def explain(target: tuple[str, ...], as_json: bool) -> None:
    """Why job JOB_ID is still pending (`explain JOB_ID`), or why pool NAME has the machines
    it has (`explain pool NAME`)."""
    if target[0] == "pool":
        if len(target) != 2:
            raise click.UsageError("write: sp00ky-infra explain pool NAME")
        found = call("GET", f"/pools/{quote(target[1], safe='')}/explain")
        click.echo(json.dumps(found, indent=2) if as_json else _pool_text(found))
        return
    if len(target) != 1:
        raise click.UsageError("write: sp00ky-infra explain JOB_ID, or explain pool NAME")
    found = call("GET", f"/jobs/{quote(target[0], safe='')}/explain")
    click.echo(json.dumps(found, indent=2) if as_json else _job_text(found))


def _job_text(found: dict[str, Any]) -> str:
    where = f" in pool {found['pool']}" if found.get("pool") else ""
    lines = [f"{found['job']} is {found['status']}{where}:"]
    lines += [f"  - {cause['message']} [{cause['code']}]" for cause in found["causes"]]
    return "\n".join(lines)


def _pool_text(found: dict[str, Any]) -> str:
    lines = [f"pool {found['pool']}: {found['rule']}"]
    if "provider" in found:
        lines.append(f"  on {provider_phrase(found)}, its machines made by {found['provisioner']}")
    lines.append(
        f"  has {found['current']} serving machine(s); creates {found['create']} this tick"
        + ("; PAUSED" if found["paused"] else "")
        + (
            f"; breaker open until {_at(found['breaker_open_until'])}"
            if found["breaker_open_until"]
            else ""
        )
    )
    failed = found.get("last_failed_boot")
    if failed:
        lines.append(
            f"  last failed boot ({found.get('breaker_failures', 1)} in a row): "
            f"{failed['machine']} at {_at(failed['at'])}: {failed['reason']}"
        )
    lines += [f"  note: {note}" for note in found["notes"]]
    for machine in found["machines"]:
        lines.append(f"  {machine['name']:<22} {machine['state']:<9} {machine['reason']}")
    return "\n".join(lines)


def _at(when: float) -> str:
    return datetime.datetime.fromtimestamp(when, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
