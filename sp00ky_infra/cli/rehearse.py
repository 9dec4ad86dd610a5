"""``sp00ky-infra rehearse``: the production path of a sp00ky.yml, end to end, on this machine.

Exit codes: 0 everything worked; 1 the rehearsal ran and something failed (the verdict says
what and why); 2 it could not run (no Docker engine, no pulumi CLI or extra, a bad config).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

import click

from sp00ky_infra.config.model import DEFAULT_CONFIG_FILE
from sp00ky_infra.rehearse.errors import RehearseError
from sp00ky_infra.rehearse.phases import (
    DOWNLOADS,
    PHASES,
    TOTAL,
    parse_paths,
    side_by_side,
)
from sp00ky_infra.rehearse.rehearsal import (
    DEFAULT_TIMINGS,
    Rehearsal,
    RehearsalReport,
    rehearse_paths,
)
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
        lines += _estimates({"": report})
    lines.append("")
    lines.append(f"verdict: {'ok' if report.ok else 'FAILED'} in {report.elapsed:.0f}s")
    return lines


def _estimates(reports: Mapping[str, RehearsalReport]) -> list[str]:
    """The Hetzner estimate, a column per report, each figure marked with its source's
    number; the sources under the table."""
    sources: dict[str, int] = {}
    lines = []
    for phase in (*PHASES, "total"):
        cells = []
        for report in reports.values():
            text = _seconds(report.estimate.get(phase))
            source = report.estimate_sources.get(phase)
            if source:
                text += f" [{sources.setdefault(source, len(sources) + 1)}]"
            cells.append(f"{text:>{_WIDTH}}")
        lines.append(f"  {phase:<16}" + "".join(cells))
    lines.append("  sources:")
    lines += [f"    [{number}] {source}" for source, number in sources.items()]
    return lines


_WIDTH = 22  # a path's column


def _cell(spread: tuple[float, float] | None) -> str:
    return "-" if spread is None else f"{spread[0]:.1f}s ({spread[1]:.1f})"


def _ready(report: RehearsalReport) -> list[dict[str, float | None]]:
    """Each ready machine's phases and its create-to-ready."""
    return [
        {**m.phases, TOTAL: m.created_to_ready} for m in report.machines if m.outcome == "ready"
    ]


def paths_table(reports: Mapping[str, RehearsalReport]) -> dict[str, Any]:
    """Per row (each phase, the create-to-ready), per path: the median and max seconds."""
    table = side_by_side({path: _ready(report) for path, report in reports.items()})
    return {
        row: {p: None if s is None else {"median": s[0], "max": s[1]} for p, s in cells.items()}
        for row, cells in table.items()
    }


def render_paths(reports: Mapping[str, RehearsalReport]) -> list[str]:
    """The image paths side by side: a column per path, a row per phase (median, max in
    brackets) over its ready machines; downloads, the bake, the Hetzner estimate."""
    first = next(iter(reports.values()))
    lines = [f"rehearsal of {first.config}, image paths side by side", ""]
    lines.append(f"  {'median (max)':<16}" + "".join(f"{p:>{_WIDTH}}" for p in reports))
    for row, spreads in side_by_side({p: _ready(r) for p, r in reports.items()}).items():
        lines.append(f"  {row:<16}" + "".join(f"{_cell(c):>{_WIDTH}}" for c in spreads.values()))
    rows = {"machines ready": [str(len(_ready(r))) for r in reports.values()]}
    rows |= {kind: [str(r.downloads.get(kind, 0)) for r in reports.values()] for kind in DOWNLOADS}
    rows["bake"] = [_seconds(r.bake_seconds) for r in reports.values()]
    for name, cells in rows.items():
        lines.append(f"  {name:<16}" + "".join(f"{c:>{_WIDTH}}" for c in cells))
    if any(r.bake_seconds is not None for r in reports.values()):
        lines.append("  (the bake runs before the burst, outside every machine's create-to-ready)")
    lines += ["", "estimated create-to-ready on Hetzner:", *_estimates(reports), ""]
    shared = [n for n in first.cloud if all(n in r.cloud for r in reports.values())]
    lines += ["in the cloud:", *(f"  * {line}" for line in shared)]
    for path, report in reports.items():
        lines.append(f"{path}:")
        lines += [f"  * {line}" for line in report.cloud if line not in shared]
        lines += [f"  - {line}" for line in report.failed]
    verdicts = ", ".join(f"{p} {'ok' if r.ok else 'FAILED'}" for p, r in reports.items())
    elapsed = sum(r.elapsed for r in reports.values())
    ok = all(r.ok for r in reports.values())
    lines += ["", f"verdict: {'ok' if ok else 'FAILED'} ({verdicts}) in {elapsed:.0f}s"]
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
@click.option("--paths", "paths", default=None,
              help="Image paths to rehearse in turn, side by side: default (docker-ce), "
                   "fallback (debian-12, Docker installed at boot), baked (the pool's "
                   "snapshot, baked first), comma-separated, or all (default: the pools' "
                   "own images).")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def rehearse(
    config: str, jobs: int, backend: str | None, route: str | None, payload: str | None,
    timings: str, timeout: float, workdir: str | None, paths: str | None, as_json: bool,
) -> None:  # fmt: skip
    """Rehearse the production path on this machine: the controller with the Pulumi provisioner
    on a prod stack, against a local fake Hetzner Cloud whose servers boot their own user-data
    (containers with systemd, cloud-init and a Docker engine each). A burst of jobs, the pools
    back to zero, a guardian pass; then the verdict, with each machine's boot split into phases
    and an estimate of the same on Hetzner. Needs a Docker engine, debootstrap (to build the
    machine image once), the pulumi CLI (scripts/pulumi-engine) and the pulumi extra.
    With --paths, each image path is rehearsed in turn and the report sets them side by
    side."""
    require("pulumi", "sp00ky-infra rehearse")
    body: Any = None
    if payload is not None:
        try:
            body = json.loads(payload)
        except ValueError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="--payload") from exc
    options: dict[str, Any] = {
        "jobs": jobs, "backend": backend, "route": route, "payload": body, "timings": timings,
        "timeout": timeout,
    }  # fmt: skip
    if paths is not None:
        try:
            chosen = parse_paths(paths)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--paths") from exc
        _side_by_side(config, chosen, workdir, as_json, options)
    try:
        report = Rehearsal(config, workdir=workdir, **options).run()
    except RehearseError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    if as_json:
        click.echo(json.dumps(report.as_json(), indent=2))
    else:
        for line in render(report):
            click.echo(line)
    sys.exit(0 if report.ok else EXIT_FAILED)


def _side_by_side(
    config: str, paths: tuple[str, ...], workdir: str | None, as_json: bool,
    options: dict[str, Any],
) -> None:  # fmt: skip
    """Rehearse each path, print them side by side and exit with the verdict's code."""
    try:
        reports = rehearse_paths(config, paths, workdir=workdir, **options)
    except RehearseError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    ok = all(report.ok for report in reports.values())
    if as_json:
        found = {
            "paths": {path: report.as_json() for path, report in reports.items()},
            "side_by_side": paths_table(reports),
            "ok": ok,
        }
        click.echo(json.dumps(found, indent=2))
    else:
        for line in render_paths(reports):
            click.echo(line)
    sys.exit(0 if ok else EXIT_FAILED)
