"""The simulator: a workload with a known answer, traces, synthetic workloads, sweeps and the
command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sp00ky_infra.cli import cli
from sp00ky_infra.config.model import Pool
from sp00ky_infra.policy.cost import HETZNER_PRICES
from sp00ky_infra.simulate.providers import PROVIDERS
from sp00ky_infra.simulate.report import percentile
from sp00ky_infra.simulate.runner import Run
from sp00ky_infra.simulate.sweep import Point, pareto
from sp00ky_infra.simulate.workload import (
    Arrival,
    Distribution,
    WorkloadError,
    read_trace,
    synthetic,
    write_trace,
)
from tests.helpers import ROOT

EXAMPLE = ROOT / "examples" / "sp00ky.yml"


def test_one_machine_jobs_far_apart_every_job_waits_one_boot() -> None:
    """min 0, max 1, jobs 1000 s apart (longer than idleTimeout), arriving at odd seconds:
    the tick at the next even second asks for a machine (1 s), it boots (30 s), runs the job
    (10 s); its idle clock starts at that tick, it drains 60 s later and is destroyed at the
    next tick (2 s). Every job waits 1 + 30 s; every machine lives 30 + 10 + 60 + 2 + 0 s
    from its creation: 102 s, one started hour. (The pool does not keep paid hours.)"""
    pool = Pool("render", min=0, max=1, autoscale=True, idle_timeout=60.0, keep_paid_hours=False)
    provider = PROVIDERS["hetzner"].with_(boot=Distribution("fixed", 30.0), recycle=0.0, drain=0.0)
    arrivals = [Arrival(1.0 + 1000.0 * n, 10.0) for n in range(6)]
    price = HETZNER_PRICES["cx33"]
    report = Run(pool, arrivals, provider, price).report()
    assert report.started == 6 and report.boots == 6 and report.peak_machines == 1
    assert report.wait_p50 == report.wait_p99 == report.wait_max == 31.0
    assert report.machine_hours == 6 * 102 / 3600
    assert report.euros == pytest.approx(6 * price.hourly)
    assert report.idle_euros == pytest.approx(6 * price.hourly * (102 - 10) / 102)
    assert report.longest_queue == 1 and report.settled


def test_a_machine_whose_hour_is_paid_takes_the_jobs_that_come_in_it() -> None:
    """The same jobs on a pool that keeps paid hours: the machine asked for at 2 s stays
    ready past idleTimeout and takes the jobs at 1001, 2001 and 3001 s at once; it drains
    as its hour ends (the margin: twice two ticks, the agent's leaving and Hetzner's destroy,
    130 s, so from 3600 + 2 - 130 = 3472 s) and is gone before it. The job at 4001 s
    waits a boot again: two machines, two hours, instead of six."""
    pool = Pool("render", min=0, max=1, autoscale=True, idle_timeout=60.0)
    provider = PROVIDERS["hetzner"].with_(boot=Distribution("fixed", 30.0), recycle=0.0, drain=0.0)
    arrivals = [Arrival(1.0 + 1000.0 * n, 10.0) for n in range(6)]
    price = HETZNER_PRICES["cx33"]
    run = Run(pool, arrivals, provider, price)
    report = run.report()
    assert report.started == 6 and report.boots == 2 and report.peak_machines == 1
    waits = [job.wait for job in run.outcome().jobs]
    assert sorted(w for w in waits if w is not None) == [0.0] * 4 + [31.0] * 2
    (_, up), (drained, down), *_ = report.machines_over_time[1:]
    assert (up, down) == (1, 0) and 3472.0 <= drained < 3602.0
    assert report.euros == pytest.approx(2 * price.hourly)


def test_a_warm_machine_takes_each_job_at_once_and_buffer_boots_ahead() -> None:
    provider = PROVIDERS["hetzner"].with_(boot=Distribution("fixed", 30.0))
    arrivals = [Arrival(100.0 + 50 * n, 5.0) for n in range(5)]
    fixed = Run(Pool("render", min=1), arrivals, provider, HETZNER_PRICES["cx33"]).report()
    assert fixed.wait_max == 0.0 and fixed.boots == 1  # the one machine was ready long before
    buffered = Pool("render", min=0, max=3, autoscale=True, buffer=1)
    report = Run(buffered, arrivals, provider, HETZNER_PRICES["cx33"]).report()
    assert report.wait_max == 0.0 and report.boots >= 2


def test_queue_timeouts_and_head_of_line_blocking() -> None:
    provider = PROVIDERS["local"].with_(boot=Distribution("fixed", 1.0), recycle=0.0)
    pool = Pool("render", min=1, slots=2, queue_timeout=30.0)
    arrivals = [Arrival(10.0, 100.0), Arrival(11.0, 5.0, slots=2), Arrival(20.0, 5.0)]
    outcome = Run(pool, arrivals, provider, HETZNER_PRICES["cx33"]).outcome()
    first, big, small = outcome.jobs
    assert first.wait == 0.0
    assert big.timed_out and big.start is None  # two slots never free before its deadline
    assert small.start is not None and small.start > big.arrival.at + 30.0  # waited behind it


def test_failed_boots_open_the_breaker() -> None:
    provider = PROVIDERS["local"].with_(boot=Distribution("fixed", 1.0), failure_rate=1.0)
    pool = Pool("render", min=0, max=2, autoscale=True, queue_timeout=120.0)
    run = Run(pool, [Arrival(1.0, 1.0)], provider, HETZNER_PRICES["cx33"])
    report, outcome = run.report(), run.outcome()
    assert report.started == 0 and report.queue_timeouts == 1
    assert report.failed_boots == report.boots == 4
    # three in a row (each fails 1 s after its tick), then a minute's pause from the third
    # failure (at 7 s), then one more, which opens it again for two minutes
    assert [m.created_at for m in outcome.machines] == [2.0, 4.0, 6.0, 68.0]


def test_traces_in_csv_and_jsonl_read_back_what_was_written(tmp_path: Path) -> None:
    arrivals = synthetic(30, Distribution.parse("exp:2m"), hours=2, seed=4)
    assert len(arrivals) > 30 and all(0 <= a.at < 7200 for a in arrivals)
    for fmt in ("csv", "jsonl"):
        path = tmp_path / f"trace.{fmt}"
        with path.open("w") as out:
            assert write_trace(arrivals, out, fmt) == len(arrivals)
        again = read_trace(path)
        assert [round(a.at, 3) for a in arrivals] == [a.at for a in again]
    (tmp_path / "unix.csv").write_text("at,duration,priority\n1700000010,90s,2\n1700000000,1m,0\n")
    first, second = read_trace(tmp_path / "unix.csv")
    assert (first.at, first.duration, second.at, second.priority) == (0.0, 60.0, 10.0, 2)


def test_a_bad_trace_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"at": 1, "duration": 5}\n{"at": 2, "duration": "soon"}\n')
    with pytest.raises(WorkloadError, match="line 2: duration: 'soon' is not a duration"):
        read_trace(path)


def test_the_pareto_front_keeps_only_points_nothing_beats() -> None:
    def point(label: str, wait: float, euros: float) -> Point:
        report = Run(Pool("p", min=0), [], PROVIDERS["local"], HETZNER_PRICES["cx33"]).report()
        return Point(
            label,
            type(report)(
                **{
                    **report.as_dict(),
                    "wait_p95": wait,
                    "euros_per_day": euros,
                    "machines_over_time": (),
                }
            ),
        )

    points = [point("a", 10, 1), point("b", 5, 2), point("c", 6, 3), point("d", 1, 5)]
    assert [p.label for p in pareto(points)] == ["a", "b", "d"]
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0 and percentile([], 95) == 0.0


def test_the_command_prints_a_report_and_a_sweep(tmp_path: Path) -> None:
    runner = CliRunner()
    base = ["simulate", "--config", str(EXAMPLE), "--rate", "6", "--hours", "2"]
    done = runner.invoke(cli, [*base, "--json"])
    assert done.exit_code == 0, done.output
    data = json.loads(done.output)
    assert data["pools"]["render"]["jobs"] > 0 and data["total"]["euros"] > 0
    picture = tmp_path / "front.svg"
    done = runner.invoke(
        cli,
        [
            *base,
            "--sweep",
            "min=0,1",
            "--sweep",
            "idleTimeout=1m,5m",
            "--out",
            str(picture),
            "--workers",
            "1",
        ],
    )
    assert done.exit_code == 0, done.output
    assert "4 settings" in done.output and "Pareto front" in done.output
    assert picture.read_text().startswith("<svg")
    refused = runner.invoke(cli, [*base, "--sweep", "colour=red"])
    assert refused.exit_code == 1
    assert "colour: the simulator varies min, max, buffer, slots" in refused.output
    both = runner.invoke(cli, [*base, "--sweep", "packJobs=true,false", "--json"])
    assert both.exit_code == 0, both.output
    labels = [point["setting"] for point in json.loads(both.output)["points"]]
    assert labels == ["packJobs=true", "packJobs=false"]
    refused = runner.invoke(cli, [*base, "--set", "keepPaidHours=maybe"])
    assert refused.exit_code == 1
    assert "keepPaidHours=maybe: keepPaidHours is true or false" in refused.output


def test_jobs_export_writes_the_store_history_as_a_trace(tmp_path: Path) -> None:
    from sp00ky_infra.store import NewJob, open_store

    url = f"sqlite:///{tmp_path}/state.db"
    store = open_store(url)
    try:
        ran = store.enqueue(NewJob("renderer", "render_job", "/render", {}, priority=3), 100.0)
        store.enqueue(NewJob("renderer", "render_job", "/render", {}), 101.0)  # never started
        (claimed,) = store.claim("render_job", 1, "test", 105.0, 90.0)
        assert claimed.id == ran.id and claimed.attempt is not None
        store.complete(ran.id, claimed.attempt, {}, 112.5)
    finally:
        store.close()
    out = tmp_path / "trace.csv"
    done = CliRunner().invoke(cli, ["jobs", "export", "--store", url, "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert "1 jobs exported (1 left out)" in done.output
    (arrival,) = read_trace(out)
    assert arrival == Arrival(100.0, 7.5, "renderer", 3, 1, 0.0)
