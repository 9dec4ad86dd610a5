"""``sp00ky-infra guardian``: one pass, ``destroy-project``, and ``install``.

Exit codes: 0 the pass ran (whatever it destroyed); 1 some destroys failed; 2 bad usage, no
HCLOUD_TOKEN, or (``install``) no fabric extra; 3 the listing was incomplete, so nothing was
destroyed.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import click

from sp00ky_infra.cli.progress import pass_progress
from sp00ky_infra.guardian import Incomplete, PassReport, destroy_project, iter_plan_lines, run_pass
from sp00ky_infra.hetzner import HcloudError, HetznerAPI
from sp00ky_infra.shared.extras import require

EXIT_FAILED, EXIT_USAGE, EXIT_INCOMPLETE = 1, 2, 3


def _api() -> HetznerAPI:
    try:
        return HetznerAPI.from_env(caller="guardian")
    except HcloudError as exc:
        click.echo(f"error: {exc.message}", err=True)
        sys.exit(EXIT_USAGE)


def _logging(as_json: bool) -> None:
    """Info lines on stderr; under --json only warnings, since the JSON says the rest."""
    level = logging.WARNING if as_json else logging.INFO
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr
    )


def _finish(report: PassReport, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=2))
    else:
        for line in iter_plan_lines(report):
            click.echo(line)
        verb = "would destroy" if report.dry_run else "destroyed"
        done = len(report.verdicts) if report.dry_run else len(report.destroyed)
        click.echo(f"{report.servers} machine(s) seen; {verb} {done}" + (
            f"; {len(report.failed)} failed" if report.failed else ""))  # fmt: skip
        for server, error in report.failed:
            click.echo(f"failed to destroy {server}: {error}", err=True)
    sys.exit(EXIT_FAILED if report.failed else 0)


@click.group(invoke_without_command=True)
@click.option("--dry-run", is_flag=True, help="Print the plan; change nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan and outcome as JSON.")
@click.pass_context
def guardian(ctx: click.Context, dry_run: bool, as_json: bool) -> None:
    """One guardian pass: cap pools at 2 x limit + 1, destroy machines of schedulers silent
    for 30 minutes and machines older than 72 hours. Needs only HCLOUD_TOKEN."""
    if ctx.invoked_subcommand is not None:
        return
    _logging(as_json)
    api = _api()
    try:
        with pass_progress(quiet=as_json) as told:
            report = run_pass(api, time.time(), dry_run=dry_run, progress=told)
    except Incomplete as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_INCOMPLETE)
    _finish(report, as_json)


@guardian.command("destroy-project")
@click.argument("project")
@click.option("--dry-run", is_flag=True)
@click.option("--json", "as_json", is_flag=True)
def destroy_project_command(project: str, dry_run: bool, as_json: bool) -> None:
    """Destroy PROJECT's machines first, then its firewalls and heartbeat."""
    _logging(as_json)
    try:
        report = destroy_project(_api(), project, dry_run=dry_run)
    except Incomplete as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_INCOMPLETE)
    _finish(report, as_json)


@guardian.command("install")
@click.option("--host", required=True, help="The operations host to install the timer on.")
@click.option("--user", default="root", show_default=True)
@click.option("--port", type=int, default=22, show_default=True)
@click.option("--identity", help="SSH private key file.")
@click.option("--root", default="/", show_default=True, help="Install under this directory.")
@click.option("--command", "command", default="/usr/local/bin/sp00ky-infra", show_default=True,
              help="sp00ky-infra on the host (it must be installed there).")  # fmt: skip
def install_command(
    host: str, user: str, port: int, identity: str | None, root: str, command: str
) -> None:
    """Install the guardian's systemd service and 5-minute timer on HOST over SSH, with
    HCLOUD_TOKEN and HCLOUD_ENDPOINT from this environment in a 0600 env file."""
    require("fabric", "sp00ky-infra guardian install")
    from sp00ky_infra.guardian.install import install

    token = os.environ.get("HCLOUD_TOKEN", "")
    if not token:
        click.echo("error: HCLOUD_TOKEN is not set; the guardian needs it on the host", err=True)
        sys.exit(EXIT_USAGE)
    endpoint = os.environ.get("HCLOUD_ENDPOINT") or "https://api.hetzner.cloud/v1"
    try:
        done = install(host, token, endpoint, user, port, identity, root, command)
    except Exception as exc:  # paramiko/invoke raise many kinds; the message says what
        click.echo(f"error: installing on {user}@{host}:{port} failed: {exc}", err=True)
        sys.exit(EXIT_FAILED)
    for path in done.paths:
        click.echo(f"wrote {host}:{path}")
    click.echo("enabled sp00ky-guardian.timer" if done.enabled else
               "systemd not used there: enable sp00ky-guardian.timer yourself")  # fmt: skip
