"""The cost bench's reference days: three traces in the format `sp00ky-infra simulate
--trace` reads, made from fixed seeds with the simulator's own synthetic workloads.

    .venv/bin/python bench/traces/make.py [--out DIR] [--only NAME]

- steady: about 100,000 jobs, Poisson arrivals over the whole day (a job every 0.86 s on
  average).
- bursty: 20 bursts of 300 jobs at once at random times of the day (a Poisson process of
  bursts: some come minutes apart, some hours), over a trickle of 60 jobs an hour.
- business: nothing before 08:00 or from 18:00; in between the hourly rate climbs from 600
  to 3,600 jobs an hour by noon, holds, and falls back to 600 in the last hour.

Every job's duration is drawn exponential with a 30 s mean and kept between 2 s and 60 s.
The same seed writes the same bytes: the traces are the reference the cost bench's figures
are compared on, so a change to how they are drawn shows as a changed trace.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from sp00ky_infra.simulate.workload import (
    Arrival,
    Burst,
    Distribution,
    read_trace,
    synthetic,
    write_trace,
)

HERE = Path(__file__).resolve().parent
HOUR = 3600.0
JOB = Distribution("exp", 30.0)
SHORTEST, LONGEST = 2.0, 60.0

STEADY_PER_HOUR = 100_000 / 24
BURSTS, BURST_JOBS = 20, 300
TRICKLE_PER_HOUR = 60.0
OPENS = 8  # the business day's first hour (08:00); one rate an hour until 18:00
BUSINESS_PER_HOUR = (600, 1_500, 2_400, 3_300, 3_600, 3_600, 3_300, 2_400, 1_500, 600)


def bounded(arrivals: Sequence[Arrival], shift: float = 0.0) -> list[Arrival]:
    """``arrivals`` ``shift`` seconds later, each duration kept within SHORTEST..LONGEST."""
    return [
        replace(a, at=a.at + shift, duration=min(LONGEST, max(SHORTEST, a.duration)))
        for a in arrivals
    ]


def steady(seed: int) -> list[Arrival]:
    return bounded(synthetic(STEADY_PER_HOUR, JOB, hours=24.0, seed=seed))


def bursty(seed: int) -> list[Arrival]:
    """The bursts start on whole seconds, each anywhere in the day."""
    rng = random.Random(seed)
    starts = sorted(round(rng.uniform(0.0, 24 * HOUR)) for _ in range(BURSTS))
    bursts = [Burst(float(at), BURST_JOBS) for at in starts]
    return bounded(synthetic(TRICKLE_PER_HOUR, JOB, hours=24.0, bursts=bursts, seed=seed))


def business(seed: int) -> list[Arrival]:
    """One Poisson hour a rate, each with a seed of its own, placed at its hour of the day."""
    day: list[Arrival] = []
    for n, rate in enumerate(BUSINESS_PER_HOUR):
        hour = synthetic(rate, JOB, hours=1.0, seed=seed * 100 + n)
        day.extend(bounded(hour, shift=(OPENS + n) * HOUR))
    return day


@dataclass(frozen=True, slots=True)
class Trace:
    name: str
    seed: int
    draw: Callable[[int], list[Arrival]]

    @property
    def file(self) -> str:
        return f"{self.name}.csv"

    def arrivals(self) -> list[Arrival]:
        return self.draw(self.seed)


TRACES = {
    t.name: t
    for t in (
        Trace("steady", 1, steady),
        Trace("bursty", 2, bursty),
        Trace("business", 3, business),
    )
}


def write(trace: Trace, folder: Path = HERE) -> Path:
    """The trace as CSV in ``folder``, exactly as write_trace lays it out."""
    path = folder / trace.file
    with path.open("w", newline="", encoding="utf-8") as out:
        write_trace(trace.arrivals(), out)
    return path


def load(trace: Trace) -> list[Arrival]:
    """The trace's jobs exactly as `simulate --trace` reads its file: written, then read."""
    with tempfile.TemporaryDirectory() as folder:
        return read_trace(write(trace, Path(folder)))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder (default: this one)")
    parser.add_argument("--only", choices=sorted(TRACES), help="one trace (default: all)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for trace in [TRACES[args.only]] if args.only else TRACES.values():
        path = write(trace, args.out)
        print(f"{trace.name}: {path} ({path.stat().st_size:,} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
