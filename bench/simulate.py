"""Simulator benchmark: how long a simulated day takes, and a 27-point sweep.

    .venv/bin/python bench/simulate.py [--workers N]

1. day: 100,000 jobs in one day (Poisson, durations exponential with a 30 s mean) through
   one pool (min 2, max 60, buffer 2, idleTimeout 5m, cx33 on the hetzner boot model): every
   tick of the day (43,200) and every job through the controller's own decisions. Target:
   at most 10 s.
2. sweep: the example pool (examples/sp00ky.yml, render) on a working day (6 jobs an hour
   for 8 hours, 4 minutes each on average, a 24 h window), min=0,1,2 x buffer=0,1,2 x
   idleTimeout=1m,5m,15m: 27 simulated days, one process per core. Target: at most 60 s.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from record import record

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.config.model import Pool
from sp00ky_infra.policy.cost import HETZNER_PRICES
from sp00ky_infra.simulate.providers import PROVIDERS
from sp00ky_infra.simulate.runner import Run, pool_run
from sp00ky_infra.simulate.sweep import pareto, parse_axes, sweep
from sp00ky_infra.simulate.workload import Distribution, synthetic

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=None)
    args = parser.parse_args()

    arrivals = synthetic(100_000 / 24, Distribution("exp", 30.0), hours=24, seed=1)
    pool = Pool("render", min=2, max=60, autoscale=True, buffer=2, idle_timeout=300.0)
    started = time.perf_counter()
    report = Run(pool, arrivals, PROVIDERS["hetzner"], HETZNER_PRICES["cx33"]).report()
    took = time.perf_counter() - started
    print(
        f"day:   {len(arrivals)} jobs, {report.span / 3600:.1f} h simulated in {took:.2f} s "
        f"(target 10 s); wait p95 {report.wait_p95:.1f} s, peak {report.peak_machines} "
        f"machines, {report.euros_per_day:.2f} EUR/day"
    )
    figures = {
        "day_seconds": took,
        "day_wait_p95_s": report.wait_p95,
        "day_peak_machines": float(report.peak_machines),
        "day_euros_per_day": report.euros_per_day,
    }

    config = load_config(ROOT / "examples" / "sp00ky.yml")
    day = synthetic(6, Distribution("exp", 240.0), hours=8, seed=0)
    run = pool_run(
        config, "render", day, PROVIDERS["hetzner"], HETZNER_PRICES["cx33"], window=86400.0
    )
    axes = parse_axes(["min=0,1,2", "buffer=0,1,2", "idleTimeout=1m,5m,15m"])
    started = time.perf_counter()
    points = sweep(run, axes, args.workers)
    took = time.perf_counter() - started
    print(
        f"sweep: {len(points)} settings x {len(day)} jobs over a day in {took:.2f} s "
        f"(target 60 s); {len(pareto(points))} on the Pareto front"
    )
    figures["sweep_seconds"] = took
    figures["sweep_pareto_points"] = len(pareto(points))
    record("simulate", figures)


if __name__ == "__main__":
    main()
