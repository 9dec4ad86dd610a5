"""Cost bench: what the pool policy costs and makes jobs wait on three reference days, the
old policy beside the new one.

    .venv/bin/python bench/cost.py [--trace NAME] [--quick] [--json]

Each trace of bench/traces/make.py (steady, bursty, business) goes through one pool of cx23
machines on the hetzner boot model, once with the old policy (no packing of jobs onto the
machine that ran work last, idle surplus machines drained at idleTimeout) and once with the
new one (the pool as configured). Both are billed over one window: the later of the two
runs' ends, a day at least. Printed per trace: euros, machine-hours, boots and the wait's
p50 / p95 / max for each policy, and new/old for euros and p95. --quick replays the first
hour of each trace from its first job (a smoke run: nothing is recorded).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from record import record
from traces.make import TRACES, load

from sp00ky_infra.config.model import MachineShape, Pool
from sp00ky_infra.policy.cost import HETZNER_PRICES
from sp00ky_infra.simulate.providers import PROVIDERS
from sp00ky_infra.simulate.report import Report, common_window, fmt_s, report
from sp00ky_infra.simulate.runner import Run, with_settings
from sp00ky_infra.simulate.workload import Arrival

DAY = 86400.0
QUICK = 3600.0
MACHINE = "cx23"
PRICE = HETZNER_PRICES[MACHINE]
PROVIDER = PROVIDERS["hetzner"]
# The old policy: the pool with these settings (model field names); the new one is the pool as
# configured (both on, their default).
OLD: Mapping[str, Any] = {"pack_jobs": False, "keep_paid_hours": False}
FIGURES = ("euros", "machine_hours", "boots", "wait_p50", "wait_p95", "wait_max")
RATIOS = ("euros", "wait_p95")


def pool(name: str, low: int, high: int, buffer: int) -> Pool:
    return Pool(
        name,
        machine=MachineShape(MACHINE),
        min=low,
        max=high,
        autoscale=True,
        buffer=buffer,
        idle_timeout=300.0,
    )


# One pool a trace: steady is the simulator bench's day (on cx23); bursty keeps one machine warm
# for the trickle and grows to 40 for a burst; business keeps one warm at night, 40 by day.
POOLS = {
    "steady": pool("steady", 2, 60, 2),
    "bursty": pool("bursty", 1, 40, 1),
    "business": pool("business", 0, 40, 1),
}


@dataclass(frozen=True, slots=True)
class Side:
    """One policy's run of one trace, billed over the window both runs share."""

    report: Report
    seconds: float  # how long the simulation took, wall clock

    def figures(self) -> dict[str, float]:
        return {name: float(getattr(self.report, name)) for name in FIGURES}


@dataclass(frozen=True, slots=True)
class Comparison:
    trace: str
    pool: Pool
    jobs: int
    window: float
    old: Side
    new: Side

    def ratio(self, figure: str) -> float | None:
        """new / old, or None when the old figure is 0."""
        before = float(getattr(self.old.report, figure))
        return float(getattr(self.new.report, figure)) / before if before else None

    def as_dict(self) -> dict[str, Any]:
        return {
            "pool": describe(self.pool),
            "jobs": self.jobs,
            "window_s": self.window,
            "old": self.old.figures() | {"seconds": self.old.seconds},
            "new": self.new.figures() | {"seconds": self.new.seconds},
            "ratio": {name: self.ratio(name) for name in RATIOS},
        }


def describe(p: Pool) -> str:
    return (
        f"min {p.min}, max {p.max}, buffer {p.buffer}, idleTimeout {fmt_s(p.idle_timeout)}, "
        f"{p.machine.type} at {PRICE.hourly:g} EUR/h, {PROVIDER.name} boot {PROVIDER.boot}"
    )


def compare(name: str, arrivals: Sequence[Arrival], quick: bool) -> Comparison:
    """The old and the new policy on ``arrivals``, each billed over the window both share."""
    configured = POOLS[name]
    least = 0.0 if quick else DAY  # a day's trace is billed for the whole day
    runs = {
        "old": Run(with_settings(configured, OLD), arrivals, PROVIDER, PRICE, window=least),
        "new": Run(configured, arrivals, PROVIDER, PRICE, window=least),
    }
    outcomes, took = {}, {}
    for side, run in runs.items():
        print(f"{name}: {side} policy, {len(arrivals):,} jobs ...", end="", file=sys.stderr)
        started = time.perf_counter()
        outcomes[side] = run.outcome()
        took[side] = time.perf_counter() - started
        print(f" {took[side]:.1f} s", file=sys.stderr, flush=True)
    window = common_window(outcome.end for outcome in outcomes.values())
    sides = {side: Side(report(name, outcomes[side], PRICE, window), took[side]) for side in runs}
    return Comparison(name, configured, len(arrivals), window, sides["old"], sides["new"])


def first_hour(arrivals: Sequence[Arrival]) -> list[Arrival]:
    """The jobs that arrive within QUICK of the trace's first one."""
    end = arrivals[0].at + QUICK if arrivals else 0.0
    return [a for a in arrivals if a.at < end]


def show(c: Comparison) -> None:
    print(f"{c.trace}: {c.jobs:,} jobs; pool {describe(c.pool)}")
    print(f"  billed over the first {fmt_s(c.window)} (the later end of the two runs)")
    print(f"  {'':<15}{'old':>12}{'new':>12}{'new/old':>10}")
    for figure in FIGURES:
        before, after = (float(getattr(s.report, figure)) for s in (c.old, c.new))
        cells = [cell(figure, before), cell(figure, after)]
        ratio = c.ratio(figure) if figure in RATIOS else None
        mark = "-" if ratio is None else f"{ratio:.3f}"
        print(f"  {figure.replace('_', ' '):<15}{cells[0]:>12}{cells[1]:>12}{mark:>10}")
    print(f"  simulated in {c.old.seconds:.1f} s (old) and {c.new.seconds:.1f} s (new)\n")


def cell(figure: str, value: float) -> str:
    if figure.startswith("wait"):
        return fmt_s(value)
    if figure == "boots":
        return f"{value:.0f}"
    return f"{value:.2f}" + (" EUR" if figure == "euros" else " h")


def recorded(comparisons: Sequence[Comparison]) -> dict[str, float]:
    """The figures as bench/results/cost.csv keeps them: TRACE_SIDE_FIGURE and the ratios."""
    rows: dict[str, float] = {}
    for c in comparisons:
        data = c.as_dict()
        for side in ("old", "new"):
            rows |= {f"{c.trace}_{side}_{k}": v for k, v in data[side].items()}
        ratios = data["ratio"].items()
        rows |= {f"{c.trace}_{k}_ratio": v for k, v in ratios if v is not None}
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", choices=sorted(TRACES), help="one trace (default: all)")
    parser.add_argument("--quick", action="store_true", help="each trace's first hour only")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    comparisons = []
    for name in [args.trace] if args.trace else list(TRACES):
        arrivals = load(TRACES[name])
        if args.quick:
            arrivals = first_hour(arrivals)
        comparisons.append(compare(name, arrivals, args.quick))
    if args.json:
        data = {c.trace: c.as_dict() for c in comparisons}
        print(json.dumps({"old_settings": dict(OLD)} | data, indent=2))
    else:
        changes = ", ".join(f"{k}={v}" for k, v in OLD.items()) or "nothing changed"
        print(f"old: each pool with {changes}; new: each pool as configured\n")
        for c in comparisons:
            show(c)
    if not args.quick:
        record("cost", recorded(comparisons))


if __name__ == "__main__":
    main()
