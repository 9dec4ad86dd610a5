"""The simulator's snapshot euros: a pool on Hetzner that boots a snapshot pays for keeping it
over the simulated window (per GB and month, by the started hour), on its own line beside the
machines' euros and in the total; a pool that boots none pays nothing more."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from sp00ky_infra.cli import cli
from sp00ky_infra.config.model import MachineShape, Pool
from sp00ky_infra.policy.cost import HETZNER_PRICES, machine_euros, snapshot_euros
from sp00ky_infra.policy.server_types import SNAPSHOT_GB_MONTHLY
from sp00ky_infra.simulate.report import DAY, table_rows
from sp00ky_infra.simulate.runner import Run, booted_snapshot
from sp00ky_infra.simulate.sweep import parse_axes, sweep
from sp00ky_infra.simulate.workload import Arrival
from tests.helpers import ROOT
from tests.simulate.test_simulate_euros import PROVIDER

PRICE = HETZNER_PRICES["cx33"]
PER_GB = SNAPSHOT_GB_MONTHLY.monthly
DISK = 80  # cx33's disk, GB: the most its snapshot holds
EXAMPLE_MACHINE = "machine: { type: cx33, locations: [fsn1, nbg1] }"


def _pool(image: str) -> Pool:
    shape = MachineShape(type="cx33", image=image)
    return Pool("render", min=0, max=1, autoscale=True, idle_timeout=60.0, machine=shape)


def test_a_snapshot_pool_pays_for_its_snapshot_over_the_window_beside_its_machines() -> None:
    """One job, one machine for one started hour; the snapshot kept the whole window."""
    pool = _pool("123456789")
    run = Run(
        pool, [Arrival(1.0, 10.0)], PROVIDER, PRICE, snapshot=booted_snapshot(pool, "hetzner", 2.5)
    )
    r = run.report(window=DAY)
    stored = snapshot_euros(2.5, PER_GB, DAY)
    assert stored == pytest.approx(2.5 * PER_GB * 24 / 720)  # 24 started hours of 720
    assert r.machine_euros == pytest.approx(PRICE.hourly)
    assert r.snapshot_euros == pytest.approx(stored)
    assert r.euros == pytest.approx(PRICE.hourly + stored)
    assert r.euros_per_day == pytest.approx(r.euros)  # the window is a day
    assert r.snapshot_gigabytes == 2.5
    rows = dict(table_rows(r))
    assert rows["machine euros"] == f"{PRICE.hourly:.2f} EUR"
    assert rows["snapshot euros"].startswith(f"{stored:.4f} EUR (2.5 GB kept 24.00h")


def test_a_pool_that_boots_no_snapshot_pays_for_its_machines_alone() -> None:
    pool = _pool("docker-ce")
    assert booted_snapshot(pool, "hetzner", 2.5) is None
    r = Run(pool, [Arrival(1.0, 10.0)], PROVIDER, PRICE).report(window=DAY)
    assert r.euros == r.machine_euros == pytest.approx(machine_euros(PRICE, 70.0))
    assert (r.snapshot_euros, r.snapshot_gigabytes) == (0.0, 0.0)
    assert "snapshot euros" not in dict(table_rows(r))


def test_what_boots_a_snapshot_and_how_large_it_is_assumed() -> None:
    for image in ("123456789", "sp00ky/pool=render", "baked"):
        found = booted_snapshot(_pool(image), "hetzner", None)
        assert found is not None and found.gigabytes == DISK  # the server type's disk
        assert found.source == f"at most cx33's {DISK} GB disk" and found.per_gb_month == PER_GB
    assert booted_snapshot(_pool("123456789"), "docker", None) is None  # no Hetzner snapshot
    given = booted_snapshot(_pool("baked"), "hetzner", 1.75)
    assert given is not None and (given.gigabytes, given.source) == (1.75, "snapshotGigabytes=1.75")
    unknown = replace(_pool("baked"), machine=MachineShape(type="cx99", image="baked"))
    with pytest.raises(
        ValueError, match="boots a snapshot of unknown size: give --set snapshotGigabytes=N"
    ):
        booted_snapshot(unknown, "hetzner", None)


def test_a_sweep_of_the_snapshot_size_prices_each_point_over_one_window() -> None:
    pool = _pool("baked")
    run = Run(
        pool, [Arrival(1.0, 10.0)], PROVIDER, PRICE, snapshot=booted_snapshot(pool, "hetzner", None)
    )
    points = {
        p.label: p.report for p in sweep(run, parse_axes(["snapshotGigabytes=1,10"]), workers=1)
    }
    small, large = points["snapshotGigabytes=1"], points["snapshotGigabytes=10"]
    assert small.window == large.window
    assert large.snapshot_euros == pytest.approx(10 * small.snapshot_euros)
    assert large.machine_euros == pytest.approx(small.machine_euros)
    assert large.euros - small.euros == pytest.approx(9 * snapshot_euros(1.0, PER_GB, small.window))


def _example(tmp_path: Path, image: str) -> Path:
    shutil.copytree(ROOT / "examples", tmp_path, dirs_exist_ok=True)
    config = tmp_path / "sp00ky.yml"
    text = config.read_text()
    assert EXAMPLE_MACHINE in text
    machine = f'machine: {{ type: cx33, locations: [fsn1, nbg1], image: "{image}" }}'
    config.write_text(text.replace(EXAMPLE_MACHINE, machine))
    return config


def test_the_command_reports_the_snapshot_line_and_adds_it_to_the_total(tmp_path: Path) -> None:
    config = _example(tmp_path, "123456789")
    base = ["simulate", "--config", str(config), "--rate", "6", "--hours", "2", "--window", "24h"]
    runner = CliRunner()
    done = runner.invoke(cli, [*base, "--set", "snapshotGigabytes=2.5", "--json"])
    assert done.exit_code == 0, done.output
    render = json.loads(done.output)["pools"]["render"]
    stored = snapshot_euros(2.5, PER_GB, render["window"])
    assert render["snapshot_gigabytes"] == 2.5
    assert render["snapshot_euros"] == pytest.approx(stored)
    assert render["euros"] == pytest.approx(render["machine_euros"] + stored)
    text = runner.invoke(cli, base)
    assert text.exit_code == 0, text.output
    assert "boots a snapshot of 80 GB (at most cx33's 80 GB disk)" in text.output
    assert "  snapshot euros" in text.output and "  machine euros" in text.output
    swept = runner.invoke(cli, [*base, "--sweep", "idleTimeout=1m,5m", "--workers", "1"])
    assert swept.exit_code == 0, swept.output
    assert "2 settings" in swept.output
    refused = runner.invoke(cli, [*base, "--set", "snapshotGigabytes=lots"])
    assert refused.exit_code == 1
    assert "snapshotGigabytes=lots: a size in GB, 0 or more, e.g. 2.5" in refused.output
