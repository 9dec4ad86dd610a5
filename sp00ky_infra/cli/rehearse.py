"""``sp00ky-infra rehearse``: the production path of a sp00ky.yml, end to end, on this machine.

Exit codes: 0 everything worked; 1 the rehearsal ran and something failed (the verdict says
what and why); 2 it could not run (no Docker engine, no pulumi CLI or extra, a bad config).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from sp00ky_infra.config.model import DEFAULT_CONFIG_FILE
from sp00ky_infra.rehearse.errors import RehearseError
from sp00ky_infra.rehearse.phases import ESTIMATE, PHASES
from sp00ky_infra.rehearse.rehearsal import DEFAULT_TIMINGS, Rehearsal, RehearsalReport
from sp00ky_infra.shared.extras import require

EXIT_FAILED, EXIT_USAGE = 1, 2


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}s"


def render(report: RehearsalReport) -> list[str]:
    """The verdict as a person reads it."""
    lines = [f"rehearsal of {report.config} (pools: {', '.join(report.pools)})", ""]
    if report.machines:
        lines.append("create-to-ready per machine (" + ", ".join(PHASES) + "):")
        for machine in report.machines:
            spans = " ".join(f"{_seconds(machine.phases.get(p)):>7}" for p in PHASES)
            total = _seconds(machine.created_to_ready)
            lines.append(f"  {machine.name:<24} {machine.outcome:<8} {spans}  = {total}")
            if machine.cause:
                lines.append(f"    cause: {machine.cause}")
        lines.append("")
    lines.append("worked:")
    lines += [f"  + {line}" for line in report.worked] or ["  (nothing)"]
    if report.failed:
        lines.append("failed:")
        lines += [f"  - {line}" for line in report.failed]
        shown = next((m for m in report.machines if m.console), None)
        if shown is not None:  # one is enough to see it; every one is in the working directory
            lines.append(f"  the agent's last words on {shown.name}:")
            lines += [f"    {line}" for line in shown.console.rstrip().splitlines()[-4:]]
            lines.append(f"  consoles of the failed machines: {report.workdir}/consoles/")
    lines.append("in the cloud:")
    lines += [f"  * {line}" for line in report.cloud]
    if report.estimate.get("total") is not None:
        lines.append("estimated create-to-ready on Hetzner:")
        notes: list[str] = []
        for phase in PHASES:
            figure, source = ESTIMATE[phase]
            if figure is None:
                how = "as measured here"
            else:
                notes.append(f"  [{len(notes) + 1}] {phase}: {source}")
                how = f"[{len(notes)}]"
            lines.append(f"  {phase:<14} {_seconds(report.estimate.get(phase)):>7}  {how}")
        lines.append(f"  {'total':<14} {_seconds(report.estimate.get('total')):>7}")
        lines += notes
    lines.append("")
    lines.append(f"verdict: {'ok' if report.ok else 'FAILED'} in {report.elapsed:.0f}s")
    return lines


@click.command()
@click.argument("config", required=False, default=DEFAULT_CONFIG_FILE, metavar="[SP00KY_YML]")
@click.option("--jobs", "jobs", default=5, show_default=True, type=click.IntRange(1, 1000),
              help="Jobs to queue for each Hetzner pool's backend.")  # fmt: skip
@click.option("--backend", default=None, help="Queue jobs for this backend only.")
@click.option("--route", default=None, help="The route to POST (default: the spec's first).")
@click.option("--payload", default=None,
              help="The jobs' JSON payload (default: the smallest the spec takes).")  # fmt: skip
@click.option("--timings", default=DEFAULT_TIMINGS, show_default=True,
              help="Timings for the rehearsal's controller, as SPKY_POOL_TIMINGS.")  # fmt: skip
@click.option("--timeout", default=900.0, show_default=True, type=click.FloatRange(10),
              help="Seconds to wait for the pools to settle.")  # fmt: skip
@click.option("--workdir", default=None, type=click.Path(file_okay=False),
              help="Where it keeps its store, stack and logs (default: a temp dir).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def rehearse(
    config: str, jobs: int, backend: str | None, route: str | None, payload: str | None,
    timings: str, timeout: float, workdir: str | None, as_json: bool,
) -> None:  # fmt: skip
    """Rehearse the production path on this machine: the controller with the Pulumi provisioner
    on a prod stack, against a local fake Hetzner Cloud whose servers boot their own user-data
    (containers with systemd, cloud-init and a Docker engine each). A burst of jobs, the pools
    back to zero, a guardian pass; then the verdict, with each machine's boot split into phases
    and an estimate of the same on Hetzner. Needs a Docker engine, debootstrap (to build the
    machine image once), the pulumi CLI (scripts/pulumi-engine) and the pulumi extra."""
    require("pulumi", "sp00ky-infra rehearse")
    body: Any = None
    if payload is not None:
        try:
            body = json.loads(payload)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from exc
    rehearsal = Rehearsal(
        config, jobs=jobs, backend=backend, route=route, payload=body, timings=timings,
        timeout=timeout, workdir=workdir,
    )  # fmt: skip
    try:
        report = rehearsal.run()
    except RehearseError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=2))
    else:
        for line in render(report):
            click.echo(line)
    sys.exit(0 if report.ok else EXIT_FAILED)
