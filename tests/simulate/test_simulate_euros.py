"""The simulator's euros: every run of a sweep, and every pool of a run, measured over one
common window, so that a setting that costs more never ranks as the cheaper one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from sp00ky_infra.cli import cli
from sp00ky_infra.config.model import Pool
from sp00ky_infra.policy.cost import HETZNER_PRICES, machine_euros
from sp00ky_infra.simulate.providers import PROVIDERS
from sp00ky_infra.simulate.report import DAY, report, total
from sp00ky_infra.simulate.runner import Run
from sp00ky_infra.simulate.sweep import Point, pareto, parse_axes, sweep
from sp00ky_infra.simulate.workload import Arrival, Distribution
from tests.helpers import ROOT

PRICE = HETZNER_PRICES["cx33"]
PROVIDER = PROVIDERS["hetzner"].with_(boot=Distribution("fixed", 30.0), recycle=0.0, drain=0.0)


def _points(axes: list[str], pool: Pool, arrivals: list[Arrival]) -> dict[str, Point]:
    run = Run(pool, arrivals, PROVIDER, PRICE)
    return {p.label: p for p in sweep(run, parse_axes(axes), workers=1)}


def test_a_longer_idle_timeout_that_costs_more_ranks_as_the_costlier() -> None:
    """One job: with idleTimeout 1m its machine lives under two minutes (one started hour);
    with 2h it lives past two hours (three). Divided by each run's own span, the 2h run came
    out cheaper per day; over one window it costs three times as much."""
    pool = Pool("render", min=0, max=1, autoscale=True)
    points = _points(["idleTimeout=1m,2h"], pool, [Arrival(1.0, 10.0)])
    short, long = points["idleTimeout=1m"], points["idleTimeout=2h"]
    assert short.report.euros == pytest.approx(PRICE.hourly)
    assert long.report.euros == pytest.approx(3 * PRICE.hourly)
    assert long.euros == pytest.approx(3 * short.euros)
    assert [p.label for p in pareto(list(points.values()))] == ["idleTimeout=1m"]


def test_per_day_euros_are_the_bill_over_the_common_window_scaled_to_a_day() -> None:
    """Every point shares the window (the latest end among them): a machine still alive at a
    run's end (min 1) is billed up to it by the started-hour rule."""
    pool = Pool("render", min=0, max=1, autoscale=True)
    arrivals = [Arrival(1.0, 10.0), Arrival(600.0, 10.0)]
    points = _points(["min=0,1", "idleTimeout=1m,3h"], pool, arrivals)
    reports = [p.report for p in points.values()]
    window = max(r.span for r in reports)
    assert window > 3 * 3600
    for r in reports:
        assert r.euros_per_day == pytest.approx(r.euros * DAY / window)
        assert r.window == window
    kept = points["min=1 idleTimeout=1m"].report
    assert kept.span < window  # it settled long before; its warm machine stays till the end
    assert kept.euros >= machine_euros(PRICE, window - 10.0)


def test_the_all_pools_peak_is_the_most_machines_at_one_instant() -> None:
    """Two pools, each two machines at its peak, one early and one late: together they never
    have more than two; the total's euros per day is the pools' bill over one window."""
    pool = Pool("a", min=0, max=2, autoscale=True, idle_timeout=60.0)
    early = Run(pool, [Arrival(1.0, 100.0), Arrival(1.0, 100.0)], PROVIDER, PRICE)
    late = Run(
        Pool("b", min=0, max=2, autoscale=True, idle_timeout=60.0),
        [Arrival(20000.0, 100.0), Arrival(20000.0, 100.0)],
        PROVIDER,
        PRICE,
    )
    outcomes = [early.outcome(), late.outcome()]
    window = max(o.end for o in outcomes)
    reports = [report(n, o, PRICE, window) for n, o in zip("ab", outcomes, strict=True)]
    assert [r.peak_machines for r in reports] == [2, 2]
    whole = total(list(zip(reports, outcomes, strict=True)))
    assert whole.peak_machines == 2
    assert whole.window == window
    assert whole.euros == pytest.approx(4 * PRICE.hourly)
    assert whole.euros_per_day == pytest.approx(whole.euros * DAY / window)
    assert max(count for _, count in whole.machines_over_time) == 2


EXPORT_POOL = """  export:
    provider: hetzner
    machine: { type: cx33, locations: [fsn1] }
    min: 0
    autoscale: true
    max: 2
    idleTimeout: 1m
apps:
  exporter:
    type: backend
    runOn: { pool: export }
    spec: ./backend/openapi.yml
    baseUrl: http://127.0.0.1:8081
    method: { type: outbox, table: export_job, schema: ./src/outbox/render.surql }
    deploy: { dockerfile: ./backend/Dockerfile, port: 8081, command: [python3, backend/server.py] }
"""


def test_the_command_reports_every_pool_over_one_window(tmp_path: Path) -> None:
    """The example's pool busy at the start and a second pool busy hours later: each pool's
    euros per day and the total's cover the same window, and the total's peak is two."""
    shutil.copytree(ROOT / "examples", tmp_path, dirs_exist_ok=True)
    config = tmp_path / "sp00ky.yml"
    config.write_text(config.read_text().replace("apps:\n", EXPORT_POOL, 1))
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "at,duration,backend\n0,100,renderer\n0,100,renderer\n"
        "20000,100,exporter\n20000,100,exporter\n"
    )
    args = ["simulate", "--config", str(config), "--trace", str(trace), "--json"]
    done = CliRunner().invoke(cli, args)
    assert done.exit_code == 0, done.output
    data = json.loads(done.output)
    pools, whole = data["pools"], data["total"]
    assert [pools[name]["peak_machines"] for name in ("render", "export")] == [2, 2]
    assert whole["peak_machines"] == 2
    window = whole["window"]
    assert window >= 20000 and all(p["window"] == window for p in pools.values())
    assert whole["euros"] == pytest.approx(sum(p["euros"] for p in pools.values()))
    assert whole["euros_per_day"] == pytest.approx(whole["euros"] * DAY / window)
