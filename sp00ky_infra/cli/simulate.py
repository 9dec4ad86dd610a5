"""``sp00ky-infra simulate``: a workload through the controller's own decisions on a virtual
clock, and what each pool setting costs in waiting and in euros."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from sp00ky_infra.cli.jobs import config_option, json_option, refusals
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.config.model import Config
from sp00ky_infra.policy.cost import PRICES_DATE, Price, UnknownPrice, parse_price, price_of
from sp00ky_infra.policy.server_types import SNAPSHOT_GB_MONTHLY
from sp00ky_infra.simulate.chart import svg
from sp00ky_infra.simulate.chart import terminal as terminal_chart
from sp00ky_infra.simulate.providers import PROVIDERS, ProviderModel
from sp00ky_infra.simulate.report import (
    Report,
    Snapshot,
    common_window,
    report,
    short_window,
    table_rows,
    total,
    window_words,
)
from sp00ky_infra.simulate.runner import Run, SettingError, pool_run, setting
from sp00ky_infra.simulate.sweep import (
    Point,
    Recommendation,
    markdown,
    on_front,
    parse_axes,
    recommend,
    summary,
    sweep,
    table,
)
from sp00ky_infra.simulate.workload import (
    TRACE_COLUMNS,
    Arrival,
    Burst,
    Distribution,
    WorkloadError,
    read_trace,
    seconds,
    synthetic,
)

EXIT_REFUSED = 1
HELP = """Replay a workload through the controller's own decisions on a virtual clock.

The workload is a trace (--trace FILE, as `jobs export` writes it) or synthetic (--rate
N per hour, --duration, --hours, --burst). Every decision is the controller's own (sizing,
drain choice, admission order, head-of-line blocking, concurrency, breaker, maxLifetime,
queue timeouts); boots, jobs and agents follow the provider model. Euros are those of the
provider sp00ky.yml declares (a docker pool's are 0), by Hetzner's
rule: per started hour, capped at the monthly price; a pool on Hetzner that boots a
snapshot also pays for keeping it over the window (per GB and month, by the hour).

EUR/day is the bill over the window, scaled to a day: a window shorter than a day is
warned of (give --window 24h to bill a whole day).

--sweep prints every setting, a * on the Pareto front (no other setting both waits less at
p95 and costs less a day), and the one to choose: the cheapest whose wait p95 is within
--max-wait (every one without it), or when none is, the one that waits least; it says which
figure decided.

A trace is CSV with a header row, or JSONL (one object a line), with these columns:

\b
""" + "\n".join(
    textwrap.fill(meaning, 76, initial_indent=f"  {name:<9} ", subsequent_indent=" " * 12)
    for name, meaning in TRACE_COLUMNS
)


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(EXIT_REFUSED)


@click.command(help=HELP)
@config_option
@click.option("--pool", "pool_names", multiple=True, help="Pool(s) to simulate (default: all).")
@click.option("--trace", type=click.Path(exists=True, dir_okay=False), help="CSV or JSONL trace.")
@click.option("--rate", type=float, help="Synthetic: Poisson arrivals, jobs per hour.")
@click.option(
    "--duration",
    "duration_text",
    default="exp:5m",
    show_default=True,
    help="Synthetic: job durations (fixed:90s, uniform:30s..2m, normal:60s,15s, "
    "exp:45s, lognormal:60s,0.5).",
)
@click.option(
    "--hours", type=float, default=24.0, show_default=True, help="Synthetic: how long jobs arrive."
)
@click.option("--burst", "bursts", multiple=True, help="Synthetic: AT:COUNT jobs at once (9h:50).")
@click.option(
    "--provider",
    type=click.Choice(sorted(PROVIDERS)),
    help="Boot model (default: the pool's provider); the euros stay the declared provider's.",
)
@click.option("--boot", "boot_text", help="Boot time distribution (default: the provider's).")
@click.option("--failure-rate", type=float, help="Share of boots that fail (default 0).")
@click.option(
    "--price",
    "prices",
    multiple=True,
    help=f"TYPE=HOURLY/MONTHLY in EUR, over the table of {PRICES_DATE}.",
)
@click.option(
    "--set",
    "sets",
    multiple=True,
    help="Override a pool setting: KEY=VALUE (snapshotGigabytes=N: the size of the snapshot "
    "a pool boots; default its server type's disk).",
)
@click.option(
    "--sweep",
    "axes",
    multiple=True,
    help="KEY=V1,V2,...: every combination; prints each, the Pareto front marked, and the "
    "one to choose.",
)
@click.option(
    "--out",
    "out_file",
    type=click.Path(dir_okay=False),
    help="Sweep: write the picture here (.svg).",
)
@click.option(
    "--markdown", "as_markdown", is_flag=True, help="Sweep: print the settings as Markdown."
)
@click.option(
    "--max-wait",
    "max_wait_text",
    help="Sweep: recommend the cheapest setting whose wait p95 is at most this (90s, 2m).",
)
@click.option(
    "--window",
    "window_text",
    default="0s",
    help="Simulate at least this long (default: until the workload is done); euros per day "
    "are the bill over it, or over the latest end among the pools or settings compared.",
)
@click.option("--tick", "tick_text", default="2s", show_default=True, help="The controller's tick.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--workers", type=int, help="Sweep: processes (default: one per core).")
@json_option
def simulate(
    config_file: str | None,
    pool_names: Sequence[str],
    trace: str | None,
    rate: float | None,
    duration_text: str,
    hours: float,
    bursts: Sequence[str],
    provider: str | None,
    boot_text: str | None,
    failure_rate: float | None,
    prices: Sequence[str],
    sets: Sequence[str],
    axes: Sequence[str],
    out_file: str | None,
    as_markdown: bool,
    max_wait_text: str | None,
    window_text: str,
    tick_text: str,
    seed: int,
    workers: int | None,
    as_json: bool,
) -> None:
    with refusals():
        config = load_config(config_file)
    try:
        arrivals = _workload(trace, rate, duration_text, hours, bursts, seed)
        overrides = dict(parse_price(text) for text in prices)
        changes = dict(setting(*_pair(text)) for text in sets)
        options = _clock(tick_text, window_text, seed)
        names = _names(config, pool_names)
        runs = [
            pool_run(
                config,
                name,
                _routed(config, name, names, arrivals),
                _provider(config, name, provider, boot_text, failure_rate),
                _price(config, name, overrides),
                changes,
                **options,
            )
            for name in names
        ]
        if axes:
            if len(runs) != 1:
                _fail("--sweep varies one pool: name it with --pool")
            max_wait = seconds(max_wait_text, "--max-wait") if max_wait_text else None
            points = sweep(runs[0], parse_axes(axes), workers)
            _sweep(runs[0], points, recommend(points, max_wait), out_file, as_markdown, as_json)
            return
    except (WorkloadError, SettingError, UnknownPrice, ValueError) as exc:
        _fail(str(exc))
    _show(runs, as_json)


def _clock(tick_text: str, window_text: str, seed: int) -> dict[str, Any]:
    """The virtual clock's options of every pool's run: its tick, window and seed."""
    return {
        "tick": seconds(tick_text, "--tick"),
        "window": seconds(window_text, "--window"),
        "seed": seed,
    }


def _names(config: Config, pool_names: Sequence[str]) -> list[str]:
    """The pools named (all when none is), each one the config's."""
    names = list(pool_names) or sorted(config.pools)
    for name in names:
        if name not in config.pools:
            _fail(f"no pool {name!r} in the config (pools: {', '.join(sorted(config.pools))})")
    return names


def _show(runs: Sequence[Run], as_json: bool) -> None:
    """Each pool's report, and with several pools their total."""
    outcomes = [run.outcome() for run in runs]
    window = common_window(outcome.end for outcome in outcomes)
    reports = [
        report(run.pool.name, outcome, run.price, window, run.snapshot)
        for run, outcome in zip(runs, outcomes, strict=True)
    ]
    pairs = list(zip(reports, outcomes, strict=True))
    whole = total(pairs) if len(pairs) > 1 else None
    warning = short_window(reports[0].window if reports else 0.0)
    if as_json:
        data: dict[str, Any] = {"pools": {r.pool: r.as_dict() for r in reports}}
        data["total"] = (whole or reports[0]).as_dict()
        data["window_warning"] = warning
        click.echo(json.dumps(data, indent=2))
        return
    _warn(warning)
    for run, r in zip(runs, reports, strict=True):
        _print(r, f"pool {r.pool} ({_describe(run)})")
    if whole is not None:
        _print(whole, "all pools")


def _pair(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep:
        raise SettingError(f"{text}: write KEY=VALUE, e.g. idleTimeout=10m")
    return key, value


def _workload(
    trace: str | None,
    rate: float | None,
    duration_text: str,
    hours: float,
    bursts: Sequence[str],
    seed: int,
) -> list[Arrival]:
    if trace and (rate is not None or bursts):
        raise WorkloadError("give a trace (--trace) or a synthetic workload (--rate), not both")
    if trace:
        return read_trace(trace)
    if rate is None and not bursts:
        raise WorkloadError("no workload: give --trace FILE, or --rate N (jobs per hour)")
    return synthetic(
        rate or 0.0,
        Distribution.parse(duration_text),
        hours,
        [Burst.parse(b) for b in bursts],
        seed,
    )


def _routed(
    config: Config, name: str, names: Sequence[str], arrivals: list[Arrival]
) -> list[Arrival]:
    """The pool's own jobs: those naming its backend, and unnamed ones when it is alone."""
    backend = config.backend_for(name).name
    alone = len(names) == 1
    return [a for a in arrivals if a.backend == backend or (a.backend is None and alone)]


def _provider(
    config: Config, name: str, chosen: str | None, boot: str | None, failure_rate: float | None
) -> ProviderModel:
    model = PROVIDERS[chosen or config.pools[name].provider]
    if boot:
        model = model.with_(boot=Distribution.parse(boot))
    if failure_rate is not None:
        if not 0.0 <= failure_rate <= 1.0:
            raise ValueError(f"--failure-rate {failure_rate}: a share between 0 and 1")
        model = model.with_(failure_rate=failure_rate)
    return model


def _price(config: Config, name: str, overrides: dict[str, Price]) -> Price:
    """The pool's price by the provider sp00ky.yml declares (``--provider`` changes the boot
    model, not who bills): as ``pools get`` and ``dev`` price it."""
    pool = config.pools[name]
    return price_of(pool.machine.type, overrides, pool.provider)


def _describe(run: Run) -> str:
    p = run.pool
    top = f"max {p.max}" if p.autoscale else "fixed"
    return (
        f"min {p.min}, {top}, buffer {p.buffer}, slots {p.slots}, idleTimeout "
        f"{p.idle_timeout:g}s; {run.provider.name} boot {run.provider.boot}; "
        f"{p.machine.type} at {run.price.hourly:g} EUR/h"
        + (_snapshot_words(run.snapshot) if run.snapshot is not None else "")
    )


def _snapshot_words(snapshot: Snapshot) -> str:
    return (
        f"; boots a snapshot of {snapshot.gigabytes:g} GB ({snapshot.source}) at "
        f"{snapshot.per_gb_month:g} EUR a GB and month ({SNAPSHOT_GB_MONTHLY.source})"
    )


def _print(r: Report, title: str) -> None:
    click.echo(title)
    for label, value in table_rows(r):
        click.echo(f"  {label:<22} {value}")
    click.echo()


def _warn(warning: str | None) -> None:
    """A per-day figure over less than a day, said on stderr (--json carries it instead)."""
    if warning is not None:
        click.echo(f"warning: {warning}", err=True)


def _sweep(
    run: Run,
    points: list[Point],
    chosen: Recommendation,
    out_file: str | None,
    as_markdown: bool,
    as_json: bool,
) -> None:
    """Every setting, the front marked, and the one recommended with the figure that decided
    it; the picture written to ``out_file``."""
    window = points[0].report.window if points else 0.0
    if out_file:
        title = f"pool {run.pool.name}: wait p95 against EUR per day ({len(points)} settings)"
        Path(out_file).write_text(svg(points, title, chosen))
    if as_json:
        data = {**summary(points, chosen), "window_warning": short_window(window)}
        click.echo(json.dumps(data, indent=2))
        return
    _warn(short_window(window))
    rows = table(points)
    if as_markdown:
        click.echo(markdown(rows), nl=False)
        return
    click.echo(
        f"pool {run.pool.name}: {len(points)} settings, {sum(on_front(points))} on the Pareto "
        "front (*: no other setting both waits less at p95 and costs less a day)"
    )
    click.echo(f"({_describe(run)})")
    click.echo(f"EUR/day: {window_words(window)}, the same window for every setting\n")
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = zip(row, widths, strict=True)
        click.echo("  ".join(cell.ljust(width) for cell, width in cells).rstrip())
    click.echo()
    click.echo(f"recommended: {chosen.point.label}")
    click.echo(f"  decided by {chosen.decided_by}: {chosen.reason}\n")
    click.echo(terminal_chart(points), nl=False)
    if out_file:
        click.echo(f"\npicture: {out_file}")
